//! What the kubelet connection adapter costs (docs/performance.md, "Kubelet sockets"):
//!
//! 1. the header rewrite alone: a grpc-go-shaped request (its first on a connection, literals
//!    with indexing; then repeats, every field a dynamic table index) through
//!    [`Rewriter::feed`], in this process;
//! 2. a GetInfo round trip over a unix socket, from a client on raw HTTP/2 frames
//!    (plugin/tests/kubelet_common/raw_h2.rs) on one connection: through the adapter
//!    ([`ServedSocket`], the kubelet's percent-encoded authority) and through tonic straight on
//!    the listener (a `localhost` authority, which it accepts), alternating.
//!
//! Run: `cargo bench -p nri-accel --bench kubelet_conn`. `KUBELET_BENCH_SAMPLES` (2000) sets the
//! samples per path.
#![allow(missing_docs)]

#[path = "../tests/kubelet_common/raw_h2.rs"]
#[allow(dead_code)]
mod raw_h2;

use std::time::{Duration, Instant};

use nri_accel::kubelet::conn::rewrite::Rewriter;
use nri_accel::kubelet::conn::streams::Streams;
use nri_accel::kubelet::{ConnLimits, RegistrationService, ServedSocket};
use prost::Message;
use raw_h2::{Answer, RawGrpc, kubelet_authority};

const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

fn samples() -> usize {
    std::env::var("KUBELET_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn show(name: &str, mut d: Vec<Duration>) {
    d.sort();
    println!(
        "{name:<48} p50 {:>9.1?}  p90 {:>9.1?}  p99 {:>9.1?}  (n={})",
        pct(&d, 0.5),
        pct(&d, 0.9),
        pct(&d, 0.99),
        d.len()
    );
}

/// A request's HEADERS frame as grpc-go sends it: `first` with literals that index, else
/// every field by its dynamic table index (the table as `first` left it).
fn request_frame(stream: u32, first: bool, authority: &str) -> Vec<u8> {
    let fields: [(&[u8], &[u8]); 7] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", GET_INFO.as_bytes()),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.85.0"),
        (b"te", b"trailers"),
    ];
    let mut block = Vec::new();
    for (i, (name, value)) in fields.iter().enumerate() {
        if first {
            block.push(0x40);
            for s in [name, value] {
                block.push(s.len() as u8);
                block.extend_from_slice(s);
            }
        } else {
            // Newest entry is 62: the last field added.
            block.push(0x80 | (62 + fields.len() - 1 - i) as u8);
        }
    }
    let mut out = (block.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([1, 4]);
    out.extend(stream.to_be_bytes());
    out.extend(block);
    out
}

fn bench_rewrite(n: usize) {
    let authority = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Faccel.nri.io-reg.sock";
    let mut firsts = Vec::with_capacity(n);
    let mut repeats = Vec::with_capacity(n);
    let mut out = Vec::with_capacity(4096);
    for _ in 0..n {
        let mut r = Rewriter::default();
        let mut streams = Streams::new(1024);
        out.clear();
        r.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", &mut out, &mut streams)
            .unwrap();
        let first = request_frame(1, true, authority);
        let t = Instant::now();
        r.feed(&first, &mut out, &mut streams).unwrap();
        firsts.push(t.elapsed());
        let again = request_frame(3, false, authority);
        out.clear();
        let t = Instant::now();
        r.feed(&again, &mut out, &mut streams).unwrap();
        repeats.push(t.elapsed());
    }
    show("rewrite: a connection's first request", firsts);
    show("rewrite: a repeat (all fields indexed)", repeats);
}

async fn bench_round_trips(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let service = || {
        RegistrationService::dra(
            "accel.nri.io",
            &dir.path().join("dra.sock"),
            &["v1.DRAPlugin"],
        )
    };
    let adapted_path = dir.path().join("adapted.sock");
    let served = ServedSocket::serve(
        &adapted_path,
        tonic::transport::Server::builder().add_service(service().into_server()),
        ConnLimits::default(),
    )
    .unwrap();
    let plain_path = dir.path().join("plain.sock");
    let listener = tokio::net::UnixListener::bind(&plain_path).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service().into_server())
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let request = kubelet_proto::pluginregistration::InfoRequest {}.encode_to_vec();
    let adapted_authority = kubelet_authority(&adapted_path);
    let mut adapted = RawGrpc::connect(&adapted_path).await.unwrap();
    let mut plain = RawGrpc::connect(&plain_path).await.unwrap();
    let mut times = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 50 {
        for which in [i % 2 == 0, i % 2 == 1] {
            let (client, authority, into) = if which {
                (&mut adapted, adapted_authority.as_str(), &mut times.0)
            } else {
                (&mut plain, "localhost", &mut times.1)
            };
            let t = Instant::now();
            let answer = client
                .call(GET_INFO, authority, &request, false)
                .await
                .unwrap();
            let took = t.elapsed();
            assert!(matches!(answer, Answer::Done { ref grpc_status, .. } if grpc_status == "0"));
            // The first 50 warm up.
            if i >= 50 {
                into.push(took);
            }
        }
    }
    show("GetInfo round trip through the adapter", times.0);
    show("GetInfo round trip, tonic alone (localhost)", times.1);
    served.shutdown().await;
}

fn main() {
    let n = samples();
    bench_rewrite(n);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(bench_round_trips(n));
}
