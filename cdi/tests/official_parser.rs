//! Every spec the store writes is accepted by the official `container-device-interface` crate,
//! and its devices resolve to the qualified names the store returned.

mod common;

use cdi::{DeviceEdits, DeviceNode, Mount, SpecFormat};
use common::*;
use proptest::prelude::*;

const UID: &str = "0b7a1c2e-9f3d-4b1a-8c6e-2d4f6a8b0c1d";

fn check(dir: &std::path::Path, format: SpecFormat, uid: &str, results: &[DeviceEdits]) -> String {
    let s = store(dir, format);
    // Every spec the engine writes carries a commit stamp: the oracle sees it too.
    let stamp = cdi::Stamp {
        seq: 7,
        boot_id: "0b7a1c2e-9f3d-4b1a-8c6e-2d4f6a8b0c1d".into(),
    };
    let ids = s.write_stamped(uid, &stamp, results).unwrap();
    assert_eq!(ids, s.device_ids(uid, results.len()).unwrap());
    let path = s.spec_path(uid).unwrap();
    let (mut names, min) = official_parse(&path).unwrap_or_else(|e| {
        panic!(
            "official parser refused {}: {e}\n{}",
            path.display(),
            std::fs::read_to_string(&path).unwrap()
        )
    });
    let mut want = ids.clone();
    want.sort();
    names.sort();
    assert_eq!(names, want);
    let ours = s.read(uid).unwrap().unwrap();
    assert_eq!(
        ours.cdi_version, min,
        "we must write exactly the official minimum version"
    );
    min
}

#[test]
fn full_edits_parse_in_yaml_and_json_and_resolve_in_the_cache() {
    for format in [SpecFormat::Yaml, SpecFormat::Json] {
        let dir = tempfile::tempdir().unwrap();
        let v = check(dir.path(), format, UID, &[gpu(0), gpu(1), gpu(2)]);
        assert_eq!(v, "0.3.0");
        let cid = format!("ctr-{}", "0123456789abcdef".repeat(4));
        check(dir.path(), format, &cid, &[gpu(3)]);
        let (devices, errors) = official_cache_devices(dir.path());
        assert_eq!(errors, 0);
        let mut want: Vec<String> = (0..3)
            .map(|i| format!("accel.nri.io/device=claim-{UID}-{i}"))
            .collect();
        want.push(format!("accel.nri.io/device=claim-{cid}-0"));
        want.sort();
        assert_eq!(devices, want);
    }
}

#[test]
fn version_follows_content() {
    let dir = tempfile::tempdir().unwrap();
    let env_only = DeviceEdits {
        env: vec![("A".into(), "1".into())],
        ..Default::default()
    };
    assert_eq!(
        check(
            dir.path(),
            SpecFormat::Yaml,
            "a1",
            std::slice::from_ref(&env_only)
        ),
        "0.3.0"
    );
    let mut typed_mount = env_only.clone();
    typed_mount.mounts.push(Mount {
        host_path: "tmpfs".into(),
        container_path: "/scratch".into(),
        options: vec!["size=1m".into()],
        kind: Some("tmpfs".into()),
    });
    assert_eq!(
        check(dir.path(), SpecFormat::Yaml, "a2", &[typed_mount.clone()]),
        "0.4.0"
    );
    let mut host_path = typed_mount;
    host_path.device_nodes.push(DeviceNode {
        path: "/dev/accel0".into(),
        host_path: Some("/dev/accel7".into()),
        ..Default::default()
    });
    assert_eq!(
        check(dir.path(), SpecFormat::Json, "a3", &[env_only, host_path]),
        "0.5.0"
    );
}

#[test]
fn yaml_edge_strings_survive_the_official_parser() {
    let dir = tempfile::tempdir().unwrap();
    let tricky = [
        "",
        "yes",
        "no",
        "null",
        "~",
        "0x10",
        "1e3",
        "0.3.0",
        "- a",
        "a: b",
        "#x",
        "'q'",
        "\"dq\"",
        " lead",
        "trail ",
        "multi\nline",
        "tab\tx",
        "{a}",
        "[b]",
        "*alias",
        "&anchor",
        "!tag",
        "%dir",
        "@at",
        "`tick`",
        "日本",
        "\u{feff}bom",
        "\u{85}nel",
        "\u{2028}ls",
        "\\back",
        "del\u{7f}",
        "c1\u{9a}",
        "\u{fffe}nc",
        "\u{2029}ps",
        "\r\n",
    ];
    let edits = DeviceEdits {
        env: tricky
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("V{i}"), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    for format in [SpecFormat::Yaml, SpecFormat::Json] {
        let s = store(dir.path(), format);
        s.write(UID, std::slice::from_ref(&edits)).unwrap();
        let spec =
            container_device_interface::spec::read_spec(&s.spec_path(UID).unwrap(), 1).unwrap();
        let dev = spec.get_device(&format!("claim-{UID}-0")).unwrap();
        let env = dev.edits().container_edits.env.unwrap();
        let want: Vec<String> = edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(env, want, "{format:?}");
    }
}

/// Found by the property test below: a mount option of "\t\n" written as a `|` block scalar put
/// a tab where the official parser wants indentation, and it refused the whole spec.
#[test]
fn values_made_of_whitespace_and_newlines_read_back() {
    let dir = tempfile::tempdir().unwrap();
    for value in ["\t\n", "\tx\ny", " \n", "x\n\n", "\n", "\t"] {
        let s = store(dir.path(), SpecFormat::Yaml);
        let edits = DeviceEdits {
            mounts: vec![Mount {
                host_path: "/h".into(),
                container_path: "/c".into(),
                options: vec![value.into()],
                kind: None,
            }],
            ..Default::default()
        };
        s.write(UID, &[edits]).unwrap();
        let spec = container_device_interface::spec::read_spec(&s.spec_path(UID).unwrap(), 1)
            .unwrap_or_else(|e| panic!("{value:?}: {e:#}"));
        let ce = spec
            .get_device(&format!("claim-{UID}-0"))
            .unwrap()
            .edits()
            .container_edits;
        let oci = ce.mounts.unwrap()[0].to_oci().unwrap();
        assert_eq!(
            oci.options().clone(),
            Some(vec![value.to_string()]),
            "{value:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn arbitrary_strings_round_trip_through_the_official_parser(
        value in "[^\u{0}]{0,40}",
        path in "/[^\u{0}]{1,40}",
        json in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let format = if json { SpecFormat::Json } else { SpecFormat::Yaml };
        let s = store(dir.path(), format);
        let edits = DeviceEdits {
            env: vec![("K".into(), value.clone())],
            mounts: vec![Mount { host_path: path.clone(), container_path: path.clone(), options: vec![value.clone()], kind: None }],
            ..Default::default()
        };
        s.write("p1", &[edits]).unwrap();
        let spec = container_device_interface::spec::read_spec(&s.spec_path("p1").unwrap(), 1)
            .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
        let ce = spec.get_device("claim-p1-0").unwrap().edits().container_edits;
        prop_assert_eq!(ce.env.unwrap(), vec![format!("K={value}")]);
        let m = &ce.mounts.unwrap()[0];
        let oci = m.to_oci().unwrap();
        let source = oci.source().clone().unwrap();
        prop_assert_eq!(source.to_str().unwrap(), path.as_str());
    }
}

#[test]
fn stamped_specs_parse_at_the_same_minimum_version_and_read_back_their_stamp() {
    // The stamp is a comment line: no annotations, no cdiVersion bump (containerd 1.7.0-1.7.11
    // vendors a CDI library that knows only 0.3.0-0.5.0 and refuses unknown fields).
    let stamp = cdi::Stamp {
        seq: 18_446_744_073_709_551_615,
        boot_id: "6f1c2a3e-0b7a-4b1a-8c6e-2d4f6a8b0c1d".into(),
    };
    for format in [SpecFormat::Yaml, SpecFormat::Json] {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), format);
        let ids = s.write_stamped(UID, &stamp, &[gpu(0), gpu(1)]).unwrap();
        let path = s.spec_path(UID).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# nri-accel commit "), "{text}");
        let (mut names, min) = official_parse(&path)
            .unwrap_or_else(|e| panic!("official parser refused {}: {e}\n{text}", path.display()));
        names.sort();
        assert_eq!(names, ids);
        assert_eq!(min, "0.3.0");
        let ours = s.read(UID).unwrap().unwrap();
        assert_eq!(ours.cdi_version, "0.3.0");
        assert!(ours.annotations.is_empty());
        assert_eq!(s.stamp(UID).unwrap(), Some(stamp.clone()));
        let listed = s.list_stamped().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].stamp.as_ref(), Some(&stamp));
        let (devices, errors) = official_cache_devices(dir.path());
        assert_eq!(errors, 0);
        assert_eq!(devices.len(), 2);
    }
}
