//! The kubelet's gRPC clients (grpc-go) dial the bare socket path and send the percent-encoded
//! path as HTTP/2 `:authority`; h2 under tonic resets such a stream as malformed. These tests
//! send exactly that, from a client written on raw frames (kubelet_common/raw_h2.rs), to each
//! DRA-side socket nri-accel serves, and show that a plain tonic server refuses it. The device
//! plugin's socket is covered in device_plugin.rs; the real grpc-go client in
//! tests/kubelet-client.

mod kubelet_common;

use std::time::Duration;

use kubelet_common::raw_h2::{Answer, RawGrpc, kubelet_authority};
use kubelet_common::{DRIVER, Rig};
use kubelet_proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration};
use nri_accel::kubelet::{ConnLimits, RegistrationService, ServedSocket};
use prost::Message;

const PROTOCOL_ERROR: u32 = 1;

fn ok_messages(answer: Answer) -> Vec<Vec<u8>> {
    match answer {
        Answer::Done {
            grpc_status,
            grpc_message,
            messages,
        } => {
            assert_eq!(grpc_status, "0", "grpc-message: {grpc_message}");
            messages
        }
        other => panic!("the call failed: {other:?}"),
    }
}

#[tokio::test]
async fn a_plain_tonic_server_resets_the_kubelets_authority() {
    // What nri-accel served before: tonic straight on the listener. The test client's request
    // is refused the way the kubelet's was, so a pass below is the adapter's doing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let service = RegistrationService::dra(DRIVER, &dir.path().join("dra.sock"), &["v1.DRAPlugin"]);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let mut client = RawGrpc::connect(&path).await.unwrap();
    let request = pluginregistration::InfoRequest {}.encode_to_vec();
    let answer = client
        .call(
            "/pluginregistration.Registration/GetInfo",
            &kubelet_authority(&path),
            &request,
            false,
        )
        .await
        .unwrap();
    assert_eq!(answer, Answer::Reset(PROTOCOL_ERROR));
    // A host-like authority passes: the authority alone is what it refuses.
    let answer = client
        .call(
            "/pluginregistration.Registration/GetInfo",
            "localhost",
            &request,
            false,
        )
        .await
        .unwrap();
    assert_eq!(ok_messages(answer).len(), 1);
}

#[tokio::test]
async fn every_dra_socket_answers_the_kubelets_authority() {
    let rig = Rig::start().await;
    let registration = rig.registration_socket();
    let endpoint = rig.endpoint();

    // Registration: GetInfo twice on one connection (the second names the authority by its
    // HPACK table index, as grpc-go does), then the kubelet's verdict.
    let mut reg = RawGrpc::connect(&registration).await.unwrap();
    let authority = kubelet_authority(&registration);
    assert!(authority.starts_with("%2F"), "{authority}");
    for _ in 0..2 {
        let answer = reg
            .call(
                "/pluginregistration.Registration/GetInfo",
                &authority,
                &pluginregistration::InfoRequest {}.encode_to_vec(),
                false,
            )
            .await
            .unwrap();
        let info = pluginregistration::PluginInfo::decode(&ok_messages(answer)[0][..]).unwrap();
        assert_eq!(info.name, DRIVER);
        assert_eq!(info.endpoint, endpoint.display().to_string());
    }
    let status = pluginregistration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    let answer = reg
        .call(
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            &authority,
            &status.encode_to_vec(),
            false,
        )
        .await
        .unwrap();
    ok_messages(answer);

    // DRA v1: prepare a claim and unprepare it; v1beta1: the same.
    let mut dra = RawGrpc::connect(&endpoint).await.unwrap();
    let authority = kubelet_authority(&endpoint);
    for (uid, version) in [("uid-v1", "v1"), ("uid-v1beta1", "v1beta1")] {
        rig.allocate(uid, uid, &["whole-gpu0"]);
        let (prepare, unprepare) = if version == "v1" {
            let claim = dra_v1::Claim {
                namespace: "default".into(),
                uid: uid.into(),
                name: uid.into(),
            };
            (
                dra_v1::NodePrepareResourcesRequest {
                    claims: vec![claim.clone()],
                }
                .encode_to_vec(),
                dra_v1::NodeUnprepareResourcesRequest {
                    claims: vec![claim],
                }
                .encode_to_vec(),
            )
        } else {
            let claim = dra_v1beta1::Claim {
                namespace: "default".into(),
                uid: uid.into(),
                name: uid.into(),
            };
            (
                dra_v1beta1::NodePrepareResourcesRequest {
                    claims: vec![claim.clone()],
                }
                .encode_to_vec(),
                dra_v1beta1::NodeUnprepareResourcesRequest {
                    claims: vec![claim],
                }
                .encode_to_vec(),
            )
        };
        let service = format!("/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin");
        let answer = dra
            .call(
                &format!("{service}/NodePrepareResources"),
                &authority,
                &prepare,
                false,
            )
            .await
            .unwrap();
        let prepared =
            dra_v1::NodePrepareResourcesResponse::decode(&ok_messages(answer)[0][..]).unwrap();
        let one = &prepared.claims[uid];
        assert_eq!(one.error, "", "{version}");
        assert_eq!(one.devices.len(), 1, "{version}");
        assert_eq!(rig.held(), vec![uid.to_string()]);
        let answer = dra
            .call(
                &format!("{service}/NodeUnprepareResources"),
                &authority,
                &unprepare,
                false,
            )
            .await
            .unwrap();
        let done =
            dra_v1::NodeUnprepareResourcesResponse::decode(&ok_messages(answer)[0][..]).unwrap();
        assert_eq!(done.claims[uid].error, "", "{version}");
        assert!(rig.held().is_empty());
    }

    // Health, v1 and v1alpha1: the stream opens and sends the devices.
    for service in ["v1", "v1alpha1"] {
        let request = if service == "v1" {
            health_v1::NodeWatchResourcesRequest {}.encode_to_vec()
        } else {
            health_v1alpha1::NodeWatchResourcesRequest {}.encode_to_vec()
        };
        let answer = dra
            .call(
                &format!("/{service}.DRAResourceHealth/NodeWatchResources"),
                &authority,
                &request,
                true,
            )
            .await
            .unwrap();
        let Answer::Streaming { stream, first } = answer else {
            panic!("{service} health watch: {answer:?}");
        };
        let report = health_v1::NodeWatchResourcesResponse::decode(&first[..]).unwrap();
        assert!(!report.devices.is_empty(), "{service}");
        dra.cancel(stream).await.unwrap();
    }
    rig.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_and_idle_ones_closed_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.sock");
    let service = RegistrationService::dra(DRIVER, &dir.path().join("dra.sock"), &["v1.DRAPlugin"]);
    let limits = ConnLimits {
        max_connections: 2,
        idle_timeout: Some(Duration::from_millis(300)),
    };
    let served = ServedSocket::serve(
        &path,
        tonic::transport::Server::builder().add_service(service.into_server()),
        limits,
    )
    .unwrap();
    let request = pluginregistration::InfoRequest {}.encode_to_vec();
    let get_info = "/pluginregistration.Registration/GetInfo";
    let authority = kubelet_authority(&path);

    let mut first = RawGrpc::connect(&path).await.unwrap();
    ok_messages(
        first
            .call(get_info, &authority, &request, false)
            .await
            .unwrap(),
    );
    let mut second = RawGrpc::connect(&path).await.unwrap();
    ok_messages(
        second
            .call(get_info, &authority, &request, false)
            .await
            .unwrap(),
    );
    assert_eq!(served.connections(), 2);
    // A third is accepted and closed at once.
    if let Ok(mut third) = RawGrpc::connect(&path).await {
        assert!(
            third
                .call(get_info, &authority, &request, false)
                .await
                .is_err()
        );
    }

    // A stream held open (a request whose body never ends) keeps its connection past the
    // timeout; the idle one is closed; once the stream is reset, the first is idle too.
    let stream = first.start(get_info, &authority).await.unwrap();
    second
        .wait_closed(Duration::from_secs(20))
        .await
        .expect("the idle connection is closed");
    assert!(
        first.wait_closed(Duration::from_secs(1)).await.is_err(),
        "a connection with a stream open was closed"
    );
    first.cancel(stream).await.unwrap();
    first
        .wait_closed(Duration::from_secs(20))
        .await
        .expect("the connection is closed once idle");
    // Both slots are free again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while served.connections() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "slots not freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut again = RawGrpc::connect(&path).await.unwrap();
    ok_messages(
        again
            .call(get_info, &authority, &request, false)
            .await
            .unwrap(),
    );
    served.shutdown().await;
}
