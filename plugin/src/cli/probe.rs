//! `nri-accel probe`: asks the running daemon's loopback `/readyz`, `/livez` or `/healthz`, for
//! the kubelet's exec probes (the daemon listens on loopback only, which an HTTP probe from the
//! node cannot reach) and for an operator at a shell.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use crate::config::Config;

/// The most of an answer read: the endpoints answer one sentence.
const MAX_ANSWER_BYTES: u64 = 8 * 1024;

/// Which endpoint a probe asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeKind {
    /// `/readyz`: healthy and registered with the kubelet for every door configured.
    Ready,
    /// `/livez`: the daemon's engine still answers (a hung daemon fails it).
    Live,
    /// `/healthz`: connected to the runtime, gate open, node lock and CDI dir intact.
    Health,
}

impl ProbeKind {
    fn path(self) -> &'static str {
        match self {
            ProbeKind::Ready => "/readyz",
            ProbeKind::Live => "/livez",
            ProbeKind::Health => "/healthz",
        }
    }
}

/// Why a probe could not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The config has no metrics listener, so the daemon serves no endpoint.
    #[error(
        "the daemon serves no health endpoint: set metrics.listen in the config to a loopback address (the Helm chart sets 127.0.0.1:9464)"
    )]
    NoListener,
    /// Connecting, sending or reading failed.
    #[error(
        "no answer from the daemon's {path} on {addr}: {source}; is nri-accel running with this config?"
    )]
    Io {
        /// The endpoint asked.
        path: &'static str,
        /// The address tried.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
    /// The answer was not HTTP.
    #[error("the answer from {addr} is not an HTTP response; is another program on that port?")]
    NotHttp {
        /// The address tried.
        addr: SocketAddr,
    },
}

/// Asks the endpoint; prints its sentence and answers success only on 200.
pub fn run(config: &Config, kind: ProbeKind, timeout: Duration) -> anyhow::Result<ExitCode> {
    let addr = config.metrics.listen.ok_or(ProbeError::NoListener)?;
    let (code, body) = ask(addr, kind.path(), timeout)?;
    let body = body.trim();
    if code == 200 {
        println!("{}: {body}", kind.path());
        Ok(ExitCode::SUCCESS)
    } else {
        // The kubelet puts this line in the probe's event: the reason, not just a code.
        println!("{} answered {code}: {body}", kind.path());
        Ok(ExitCode::FAILURE)
    }
}

/// One HTTP/1.0 GET of `path` on `addr`: the status code and the body.
pub fn ask(
    addr: SocketAddr,
    path: &'static str,
    timeout: Duration,
) -> Result<(u16, String), ProbeError> {
    let io = |source| ProbeError::Io { path, addr, source };
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(io)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut raw)
        .map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .lines()
        .next()
        .and_then(|status| {
            let mut parts = status.split_whitespace();
            parts
                .next()
                .filter(|v| v.starts_with("HTTP/"))
                .and(parts.next())
        })
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or(ProbeError::NotHttp { addr })?;
    Ok((code, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot server answering `answer` to the first connection, returning what it was sent.
    fn serve_once(answer: &'static str) -> (SocketAddr, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            s.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (addr, t)
    }

    #[test]
    fn reads_the_code_and_the_sentence() {
        let (addr, t) = serve_once(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\r\nthe kubelet has not registered DRA driver x yet\n",
        );
        let (code, body) = ask(addr, "/readyz", Duration::from_secs(5)).unwrap();
        assert_eq!(code, 503);
        assert_eq!(
            body.trim(),
            "the kubelet has not registered DRA driver x yet"
        );
        assert!(t.join().unwrap().starts_with("GET /readyz HTTP/1.0\r\n"));
    }

    #[test]
    fn refuses_what_is_not_http() {
        let (addr, t) = serve_once("SSH-2.0-OpenSSH_9.6\r\n");
        let err = ask(addr, "/livez", Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, ProbeError::NotHttp { .. }), "{err}");
        t.join().unwrap();
    }

    #[test]
    fn a_closed_port_names_the_endpoint() {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let err = ask(addr, "/livez", Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("/livez"), "{err}");
    }

    #[test]
    fn no_listener_says_what_to_set() {
        let err = run(&Config::default(), ProbeKind::Ready, Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("metrics.listen"), "{err}");
    }
}
