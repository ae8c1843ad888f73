//! The plugin stub as the runtime drives it: a real `Stub` on one end of a unix socket pair; the
//! fuzzer plays the runtime on the other end. Each input is either raw bytes (mux frames, ttrpc
//! messages and everything under them) or well-framed ttrpc requests on conn 1 for every method of
//! the NRI Plugin service with arbitrary message bytes (protobuf decode and the stub's dispatch,
//! paged Synchronize reassembly, StateChange routing). The stub must answer or close, never hang
//! or panic, and must end when the runtime goes away.
#![no_main]

#[path = "common/ttrpc_wire.rs"]
mod ttrpc_wire;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nri_proto::mux::{FRAME_HEADER_LEN, encode_frames};
use nri_proto::{EventMask, Plugin, Stub};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
const METHODS: [&str; 20] = [
    "Configure",
    "Synchronize",
    "Shutdown",
    "RunPodSandbox",
    "UpdatePodSandbox",
    "PostUpdatePodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "CreateContainer",
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "UpdateContainer",
    "PostUpdateContainer",
    "StopContainer",
    "RemoveContainer",
    "StateChange",
    "ValidateContainerAdjustment",
    "UpdateContainers",
    "Unknown",
];
const HANG: Duration = Duration::from_secs(10);

/// Subscribes to every event and keeps the trait's default answers.
struct AllEvents;

#[async_trait::async_trait]
impl Plugin for AllEvents {
    fn events(&self) -> EventMask {
        EventMask::from_bits(u32::MAX)
    }
}

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// Reads mux frames from the stub and returns the ttrpc responses on conn 1, until `want` came or
/// the stub closed the socket.
async fn read_responses(peer: &mut UnixStream, want: usize) {
    let mut mux_buf: Vec<u8> = Vec::new();
    let mut conn1 = ttrpc_wire::Reader::default();
    let mut got = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while got < want {
        let n = peer.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return; // the stub closed (e.g. after Shutdown or a bad message)
        }
        mux_buf.extend_from_slice(&buf[..n]);
        while mux_buf.len() >= FRAME_HEADER_LEN {
            let conn = u32::from_be_bytes(mux_buf[0..4].try_into().unwrap());
            let len = u32::from_be_bytes(mux_buf[4..8].try_into().unwrap()) as usize;
            assert!(
                len <= 4096,
                "stub wrote a mux frame of {len} bytes, over 4096"
            );
            if mux_buf.len() < FRAME_HEADER_LEN + len {
                break;
            }
            let payload: Vec<u8> = mux_buf
                .drain(..FRAME_HEADER_LEN + len)
                .skip(FRAME_HEADER_LEN)
                .collect();
            if conn == 1 {
                for (id, ty, _) in conn1.push(&payload) {
                    assert_eq!(ty, ttrpc_wire::TYPE_RESPONSE);
                    assert!(
                        id % 2 == 1 && (id as usize) < 2 * want,
                        "response for unknown stream {id}"
                    );
                    got += 1;
                }
            }
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    rt().block_on(async {
        let (ours, peer) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        peer.set_nonblocking(true).expect("nonblocking");
        let mut peer = UnixStream::from_std(peer).expect("tokio socket");
        let stub = Arc::new(
            Stub::builder()
                .name("fuzz")
                .index("10")
                .stream(ours)
                .build()
                .expect("stub"),
        );
        let runner = {
            let stub = stub.clone();
            tokio::spawn(async move { stub.run(Arc::new(AllEvents)).await })
        };
        let work = async {
            if mode & 1 == 1 {
                let _ = peer.write_all(rest).await;
            } else {
                let calls = ttrpc_wire::split_calls(rest, 8);
                let mut ttrpc = Vec::new();
                for (i, c) in calls.iter().enumerate() {
                    let method = METHODS[c.method as usize % METHODS.len()];
                    ttrpc_wire::push_request(
                        &mut ttrpc,
                        2 * i as u32 + 1,
                        SERVICE,
                        method,
                        c.payload,
                    );
                }
                let mut wire = Vec::new();
                encode_frames(1, &ttrpc, &mut wire);
                let _ = peer.write_all(&wire).await;
                read_responses(&mut peer, calls.len()).await;
            }
            drop(peer);
            // With an inherited socket the stub ends when the runtime goes away.
            let _ = runner.await.expect("stub task panicked");
        };
        tokio::time::timeout(HANG, work).await.expect("stub hung");
    });
});
