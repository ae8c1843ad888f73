//! The admission webhook over a real TLS connection, with certificates made here: refusals
//! with the node's sentence, admitted pods, malformed and huge reviews, and a rotated
//! certificate picked up without a restart. In process (the server the binary runs), plus one
//! run of the binary itself.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nri_accel::webhook::check::Rules;
use nri_accel::webhook::fleet::{Capacity, Fleet, Published};
use nri_accel::webhook::tls::Certificates;
use nri_accel::webhook::{State, serve};
use policies::{FamilyConfig, PoolConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// A CA and the means to issue serving certificates for `localhost` under it.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// A serving certificate and its key, as PEM.
    fn issue(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }
}

/// Writes a pair the way the kubelet lays out a Secret volume: the files are symlinks through
/// `..data`, which points at a timestamped directory swapped atomically.
fn install(dir: &Path, generation: u32, (cert, key): &(String, String)) {
    let real = dir.join(format!("..gen{generation}"));
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("tls.crt"), cert).unwrap();
    std::fs::write(real.join("tls.key"), key).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(real.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(f)).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
    }
}

fn connector(ca: &Ca) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// One HTTP/1.1 request over TLS; the status and the body. `Err`: the handshake failed.
async fn post(addr: SocketAddr, ca: &Ca, head: &str, body: &[u8]) -> Result<(u16, String), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut tls = connector(ca)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    // The server may answer before it read everything (a body over its limit): a write that
    // fails then is expected, the answer is what counts.
    let _ = tls.write_all(head.as_bytes()).await;
    let _ = tls.write_all(body).await;
    let _ = tls.flush().await;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

async fn review(addr: SocketAddr, ca: &Ca, json: &str) -> (u16, String) {
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        json.len()
    );
    post(addr, ca, &head, json.as_bytes()).await.unwrap()
}

fn pod_review(uid: &str, annotations: &str) -> String {
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"{uid}","namespace":"ns","operation":"CREATE","object":{{"metadata":{{"name":"p","annotations":{annotations}}},"spec":{{"containers":[{{"name":"c","image":"x"}}]}}}}}}}}"#
    )
}

fn two_gpu_node() -> Capacity {
    let devices = (0..2)
        .map(|i| Published {
            device: policies::Device {
                id: format!("gpu{i}"),
                vendor: "nvidia".into(),
                model: String::new(),
                pci_address: None,
                pci_id: None,
                numa_node: None,
                local_cpus: Default::default(),
                memory_mib: 0,
                compute_units: 0,
                driver: None,
                nodes: Vec::new(),
                control_nodes: Vec::new(),
                uuid: None,
            },
            pool: "gpus".into(),
            family: "exclusive".into(),
        })
        .collect();
    Capacity::Known([("node-a".to_string(), devices)].into_iter().collect())
}

async fn start(dir: &Path, capacity: Capacity) -> (SocketAddr, Arc<Certificates>) {
    let certs = Certificates::load(dir).unwrap();
    let state = State {
        rules: Arc::new(Rules {
            prefix: "accel.nri.io".into(),
            pools: vec![PoolConfig::of_ids("gpus", &[], FamilyConfig::Exclusive)],
            registry: policies::Registry::with_builtins(),
        }),
        fleet: Fleet::fixed(capacity),
        claims: None,
        resource_prefix: "accel.nri.io".into(),
    };
    let server = serve("127.0.0.1:0".parse().unwrap(), &certs, state)
        .await
        .unwrap();
    (server.local_addr(), certs)
}

#[tokio::test]
async fn refuses_with_the_nodes_sentence_and_admits_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    install(dir.path(), 1, &ca.issue());
    let (addr, _certs) = start(dir.path(), two_gpu_node()).await;

    let (status, body) = review(
        addr,
        &ca,
        &pod_review("u-3", r#"{"accel.nri.io/container.c":"count=3"}"#),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["uid"], "u-3");
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 403);
    assert_eq!(
        v["response"]["status"]["message"],
        "container c of pod ns/p: claim ctr-<container id> refused: it asks 3 units of pool gpus but the pool's devices have at most 2"
    );

    // Malformed: the parser's own sentence, as the runtime would report it.
    let (_, body) = review(
        addr,
        &ca,
        &pod_review("u-bad", r#"{"accel.nri.io/container.c":"count=0"}"#),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let node = nri_accel::daemon::annotations::parse("accel.nri.io/container.c", "count=0")
        .unwrap_err()
        .to_string();
    assert_eq!(v["response"]["status"]["message"], node.as_str());

    let (_, body) = review(
        addr,
        &ca,
        &pod_review("u-2", r#"{"accel.nri.io/container.c":"count=2"}"#),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true, "{body}");
    assert_eq!(v["response"]["uid"], "u-2");

    let (_, body) = review(addr, &ca, &pod_review("u-none", r#"{"team":"a"}"#)).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("warnings").is_none(), "{body}");

    let (status, body) = post(
        addr,
        &ca,
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"",
    )
    .await
    .unwrap();
    assert_eq!((status, body.trim()), (200, "ok"));
}

#[tokio::test]
async fn malformed_and_huge_reviews_get_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    install(dir.path(), 1, &ca.issue());
    let (addr, _certs) = start(dir.path(), Capacity::Unknown("test".into())).await;

    let (status, body) = review(addr, &ca, "{not json").await;
    assert_eq!(status, 400);
    assert!(
        body.starts_with("bad AdmissionReview: the body is not an AdmissionReview in JSON"),
        "{body}"
    );

    let v1beta1 = r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}"#;
    let (status, body) = review(addr, &ca, v1beta1).await;
    assert_eq!(status, 400);
    assert!(
        body.contains("admission.k8s.io/v1beta1") && body.contains("admissionReviewVersions"),
        "{body}"
    );

    // A declared length over the limit: refused before the body is read.
    let head = "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 104857600\r\n\r\n";
    let (status, body) = post(addr, &ca, head, b"").await.unwrap();
    assert_eq!(status, 413);
    assert!(body.contains("larger than 3145728 bytes"), "{body}");

    // A chunked body with no length, larger than the limit: cut off at the limit.
    let chunk = vec![b' '; 64 * 1024];
    let mut body = Vec::new();
    for _ in 0..(4 * 1024 * 1024 / chunk.len()) {
        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(&chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let head = "POST /validate HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
    let (status, text) = post(addr, &ca, head, &body).await.unwrap();
    assert_eq!(status, 413, "{text}");

    // The server still answers afterwards.
    let (status, _) = review(addr, &ca, &pod_review("u", "{}")).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_rotated_certificate_is_used_without_a_restart_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (Ca::new("old"), Ca::new("new"));
    install(dir.path(), 1, &old.issue());
    let (addr, certs) = start(dir.path(), Capacity::Unknown("test".into())).await;
    let probe = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    assert!(post(addr, &old, probe, b"").await.is_ok());
    assert!(
        post(addr, &new, probe, b"").await.is_err(),
        "the new CA does not sign the first pair"
    );

    // A broken pair (a key of another certificate): refused, the old pair stays.
    let (cert, _) = new.issue();
    let (_, other_key) = new.issue();
    install(dir.path(), 2, &(cert, other_key));
    let e = certs.reload().unwrap_err().to_string();
    assert!(
        e.contains("tls.key") && e.contains("the key must be the certificate's"),
        "{e}"
    );
    assert!(post(addr, &old, probe, b"").await.is_ok());

    // The Secret is updated: the next handshake uses the new pair.
    install(dir.path(), 3, &new.issue());
    assert!(certs.reload().unwrap());
    assert!(post(addr, &new, probe, b"").await.is_ok());
    assert!(post(addr, &old, probe, b"").await.is_err());

    // The watcher finds a change by itself (waited for, with a deadline, not timed).
    let _watch = certs.watch(Duration::from_millis(50));
    install(dir.path(), 4, &old.issue());
    let deadline = Instant::now() + Duration::from_secs(60);
    while post(addr, &old, probe, b"").await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the watcher did not load the rotated pair in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_binary_serves_the_webhook() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    install(&tls, 1, &ca.issue());
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "pools:\n  - name: gpus\n    family: { kind: exclusive }\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nri-accel"))
        .args(["--config"])
        .arg(&config)
        .args([
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "none",
            "--tls-dir",
        ])
        .arg(&tls)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("nri-accel webhook: serving https://")
        .and_then(|s| s.strip_suffix("/validate"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    let ask = pod_review(
        "u-sliced",
        r#"{"accel.nri.io/container.c":"family=sliced"}"#,
    );
    let (status, body) = review(addr, &ca, &ask).await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(
        v["response"]["status"]["message"],
        "container c of pod ns/p: claim ctr-<container id> refused: no pool of family sliced has devices matching request annotation"
    );
}
