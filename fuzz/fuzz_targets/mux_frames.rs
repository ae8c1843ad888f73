//! The NRI connection multiplexer reading what the runtime sends: arbitrary bytes written by the
//! peer end of a real unix socket pair into a `Mux` with conns 1 (plugin service), 2 (runtime
//! service) and 7 open. Every conn must reach end of stream or an error (no hang, no panic), and
//! no conn may deliver more bytes than the peer sent. Allocation stays bounded: run-all.sh runs
//! it under `-malloc_limit_mb`, and a frame header announcing up to 4 GiB must not allocate it.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use nri_proto::mux::{Mux, MuxConn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const HANG: Duration = Duration::from_secs(10);

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

async fn drain(mut conn: MuxConn) -> usize {
    let mut got = Vec::new();
    // An error (a bad ttrpc header on the conn) ends the stream too.
    let _ = conn.read_to_end(&mut got).await;
    got.len()
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rt().block_on(async {
        let (ours, mut peer) = UnixStream::pair().expect("socket pair");
        let mux = Mux::new(ours).expect("register the socket");
        let c1 = mux.open(1).expect("conn 1");
        let c2 = mux.open(2).expect("conn 2");
        let c7 = mux.open(7).expect("conn 7");
        let mut closed = mux.closed();
        let work = async {
            let writer = async {
                // The mux may close the socket early on a bad frame; the write then fails.
                let _ = peer.write_all(data).await;
                drop(peer);
            };
            let (_, a, b, c) = tokio::join!(writer, drain(c1), drain(c2), drain(c7));
            assert!(
                a + b + c <= data.len(),
                "conns delivered more than the peer sent"
            );
            closed
                .wait_for(|r| r.is_some())
                .await
                .expect("close reason");
        };
        tokio::time::timeout(HANG, work)
            .await
            .expect("mux hung on peer input");
    });
});
