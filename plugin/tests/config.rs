//! The config: the shipped default file, defaults, and errors with line and column.

use std::path::PathBuf;

use nri_accel::config::{Config, ConfigError, ConfigSource, Position};
use policies::{FamilyConfig, UnhealthyDevices};

fn packaged() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/config.yaml")
}

fn err(text: &str) -> ConfigError {
    Config::from_yaml(text, "test.yaml").expect_err("config must be refused")
}

/// The field, position and message of a config refused as invalid (not as a syntax error).
fn invalid(text: &str) -> (String, Option<Position>, String) {
    match err(text) {
        ConfigError::Invalid {
            field,
            position,
            message,
            ..
        } => (field, position, message),
        e => panic!("{e:?}"),
    }
}

fn at(line: u64, column: u64) -> Option<Position> {
    Some(Position { line, column })
}

#[test]
fn packaged_config_parses_validates_and_equals_the_defaults() {
    let cfg = Config::load(&packaged()).unwrap();
    assert_eq!(
        cfg,
        Config::default(),
        "packaging/config.yaml documents the defaults"
    );
}

/// The shipped file's comment on `nri.cdi_injection` says what the binary does (every value gives
/// device nodes) and never promises CDI device names for any value (issue 39 item 8).
#[test]
fn packaged_config_says_what_cdi_injection_does() {
    let text = std::fs::read_to_string(packaged()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("cdi_injection:"))
        .expect("the shipped config sets nri.cdi_injection");
    let start = lines[..at]
        .iter()
        .rposition(|l| !l.trim_start().starts_with('#'))
        .map_or(0, |i| i + 1);
    let comment = lines[start..at].join("\n");
    assert!(comment.contains("every value gives the same"), "{comment}");
    assert!(comment.contains("never CDI"), "{comment}");
    for promise in ["always CDI device names", "CDI device names where"] {
        assert!(!comment.contains(promise), "{comment}");
    }
}

#[test]
fn packaged_config_examples_parse_when_uncommented() {
    // The commented examples must stay valid: uncomment the pool examples
    // (a pool list entry comment starts with "  # - name:").
    let text = std::fs::read_to_string(packaged()).unwrap();
    let mut out = String::new();
    let mut in_pools = false;
    for line in text.lines() {
        if line.starts_with("pools:") {
            in_pools = true;
        } else if !line.starts_with(' ') && !line.is_empty() {
            in_pools = false;
        }
        let uncommented = line
            .strip_prefix("  # ")
            .filter(|l| in_pools && (l.starts_with("- ") || l.starts_with("  ")));
        out.push_str(&uncommented.map_or_else(|| line.to_string(), |l| format!("  {l}")));
        out.push('\n');
    }
    let cfg = Config::from_yaml(&out, "uncommented").unwrap();
    assert_eq!(cfg.pools.len(), 4);
    assert!(matches!(
        cfg.pools[1].family,
        FamilyConfig::Shared { replicas: 4, .. }
    ));
    assert_eq!(cfg.pools[1].unhealthy, UnhealthyDevices::TaintNoSchedule);
    assert_eq!(cfg.pools[2].vendor_cdi, policies::VendorCdi::Required);
    assert!(
        matches!(&cfg.pools[3].family, FamilyConfig::Sliced { profiles, .. } if profiles.len() == 3)
    );
}

#[test]
fn empty_and_comment_only_files_give_the_defaults() {
    assert_eq!(Config::from_yaml("", "e").unwrap(), Config::default());
    assert_eq!(
        Config::from_yaml("# nothing\n\n", "e").unwrap(),
        Config::default()
    );
    let d = Config::default();
    assert_eq!(d.nri.plugin_index, "10");
    assert_eq!(d.state_dir, PathBuf::from("/var/lib/nri-accel"));
    assert_eq!(d.pools.len(), 1);
}

#[test]
fn unknown_field_names_line_and_column() {
    let e = err("state_dir: /var/lib/x\nnri:\n  socket: /run/nri.sock\n  plugin_nmae: accel\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    assert_eq!(e.position(), at(4, 3));
    let text = e.to_string();
    assert!(
        text.starts_with("test.yaml:4:3: unknown field `plugin_nmae`"),
        "{text}"
    );
}

#[test]
fn a_pools_unhealthy_mode_parses_and_an_unknown_one_names_the_accepted_ones() {
    let pool = |mode: &str| {
        format!(
            "pools:\n  - name: p\n    select: {{}}\n    family: {{ kind: exclusive }}\n    unhealthy: {mode}\n"
        )
    };
    let cfg = Config::from_yaml(&pool("taint-no-execute"), "t").unwrap();
    assert_eq!(cfg.pools[0].unhealthy, UnhealthyDevices::TaintNoExecute);
    assert_eq!(cfg.pools[0].unhealthy.taint_effect(), Some("NoExecute"));
    let cfg = Config::from_yaml(&pool("withdraw"), "t").unwrap();
    assert_eq!(cfg.pools[0].unhealthy, UnhealthyDevices::Withdraw);
    let e = err(&pool("taint"));
    assert_eq!(e.position(), at(5, 16));
    let text = e.to_string();
    assert!(
        text.contains(
            "unknown variant `taint`, expected one of withdraw, taint-no-schedule, taint-no-execute"
        ),
        "{text}"
    );
}

#[test]
fn unknown_top_level_field_is_an_error() {
    let e = err("log:\n  level: info\nlogging: {}\n");
    assert_eq!(e.position(), at(3, 1));
}

#[test]
fn wrong_type_names_line_and_column() {
    let e = err("claims_api:\n  max_message_bytes: lots\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    assert_eq!(e.position(), at(2, 22));
    let e = err("log:\n  level: loud\n");
    assert_eq!(e.position(), at(2, 10));
}

#[test]
fn a_family_that_is_not_a_mapping_names_the_field_and_the_accepted_forms() {
    let e = err("pools:\n  - name: whole\n    family: exclusive\n");
    let text = e.to_string();
    assert_eq!(e.position(), at(3, 5), "{text}");
    assert!(
        text.starts_with("test.yaml:3:5: pools[0].family: expected a mapping"),
        "{text}"
    );
    assert!(!text.contains("internally tagged"), "{text}");
    for form in [
        "{kind: exclusive}",
        "{kind: shared, replicas:",
        "{kind: sliced, slots:",
        "{kind: custom, policy:",
    ] {
        assert!(text.contains(form), "{form} missing: {text}");
    }
    assert!(
        text.ends_with("(here, for example: family: {kind: exclusive})"),
        "{text}"
    );
    let e = err("pools:\n  - name: whole\n    family: 3\n");
    assert!(e.to_string().contains("found integer `3`"), "{e}");
    // A sequence is not a family either (serde alone took its first item as the kind).
    let e = err("pools:\n  - name: whole\n    family: [exclusive]\n");
    let text = e.to_string();
    assert!(
        text.contains("pools[0].family: expected a mapping"),
        "{text}"
    );
    assert!(text.contains("found sequence"), "{text}");
    let e = err("pools:\n  - name: whole\n    family: {replicas: 2}\n");
    assert!(e.to_string().contains("the family names no kind"), "{e}");
}

/// One rule for every subcommand: only the default path may be missing (the built-in
/// defaults); any other missing file is an error naming it, and a file that exists is read,
/// whichever path it is at.
#[test]
fn only_the_default_path_may_be_missing() {
    let dir = tempfile::tempdir().unwrap();
    let default = dir.path().join("config.yaml");
    let (cfg, source) = Config::load_or_defaults_at(&default, &default).unwrap();
    assert_eq!((cfg, source), (Config::default(), ConfigSource::Defaults));

    let other = dir.path().join("other.yaml");
    let e = Config::load_or_defaults_at(&other, &default).unwrap_err();
    assert!(matches!(e, ConfigError::Missing { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{}: no such config file; ", other.display())),
        "{text}"
    );
    assert!(
        text.contains("/etc/nri-accel/config.yaml, may be missing"),
        "{text}"
    );

    std::fs::write(&default, "reconcile_interval_secs: 7\n").unwrap();
    let (cfg, source) = Config::load_or_defaults_at(&default, &default).unwrap();
    assert_eq!(
        (cfg.reconcile_interval_secs, source),
        (7, ConfigSource::File)
    );
    // A default file that exists but is broken is an error like any other.
    std::fs::write(&default, "reconcile_interval_secs: soon\n").unwrap();
    assert!(Config::load_or_defaults_at(&default, &default).is_err());
}

#[test]
fn bad_value_names_field_line_and_column() {
    let e = err("nri:\n  plugin_index: \"7\"\n");
    match &e {
        ConfigError::Invalid {
            field,
            position,
            message,
            ..
        } => {
            assert_eq!(field, "nri.plugin_index");
            assert_eq!(*position, at(2, 17));
            assert!(message.contains("exactly two digits"), "{message}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(
        e.to_string()
            .starts_with("test.yaml:2:17: nri.plugin_index: "),
        "{e}"
    );
}

#[test]
fn unquoted_plugin_index_keeps_its_spelling() {
    let cfg = Config::from_yaml("nri: {plugin_index: 05}\n", "t").unwrap();
    assert_eq!(cfg.nri.plugin_index, "05");
}

#[test]
fn duplicate_pool_names_point_at_the_second() {
    let text = "pools:\n  - name: a\n    family: {kind: exclusive}\n  - name: a\n    family: {kind: exclusive}\n";
    let e = err(text);
    let ConfigError::Invalid {
        field, position, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(field, "pools[1].name");
    assert_eq!(*position, at(4, 11));
}

#[test]
fn sliced_profile_past_the_last_slot_is_refused() {
    let text = "\
pools:
  - name: s
    family:
      kind: sliced
      slots: 8
      profiles:
        - { name: 1g, size: 1, starts: [0, 7] }
        - { name: 4g, size: 4, starts: [0, 5] }
";
    let (field, position, message) = invalid(text);
    assert_eq!(field, "pools[0].family.profiles[1].starts");
    assert_eq!(position.map(|p| p.line), Some(8));
    assert!(
        message.contains("starting at slot 5 with size 4 runs past the 8 slots"),
        "{message}"
    );
}

#[test]
fn zero_size_profile_and_zero_replicas_are_refused() {
    let e = err(
        "pools:\n  - name: s\n    family: {kind: sliced, slots: 2, profiles: [{name: z, size: 0, starts: [0]}]}\n",
    );
    assert!(e.to_string().contains("has size 0"), "{e}");
    let e = err("pools:\n  - name: s\n    family: {kind: shared, replicas: 0}\n");
    let ConfigError::Invalid { field, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(field, "pools[0].family.replicas");
}

#[test]
fn other_bad_values_are_refused() {
    for (text, field) in [
        ("nri: {plugin_name: \"acc el\"}\n", "nri.plugin_name"),
        ("nri: {socket: relative/nri.sock}\n", "nri.socket"),
        ("claims_api: {socket: claims.sock}\n", "claims_api.socket"),
        (
            "claims_api: {max_message_bytes: 10}\n",
            "claims_api.max_message_bytes",
        ),
        ("cdi: {class: dev.ice}\n", "cdi.class"),
        ("cdi: {vendor: 1vendor}\n", "cdi.vendor"),
        ("state_dir: var/lib\n", "state_dir"),
        ("pools: []\n", "pools"),
        ("metrics: {listen: \"0.0.0.0:9464\"}\n", "metrics.listen"),
        ("annotations: {prefix: Accel}\n", "annotations.prefix"),
        ("dra: {max_connections: 0}\n", "dra.max_connections"),
        (
            "device_plugin: {max_connections: 0}\n",
            "device_plugin.max_connections",
        ),
        (
            "discovery:\n  static_devices:\n    - {id: a, vendor: x, nodes: [{path: /tmp/x, major: 1, minor: 1}]}\n",
            "discovery.static_devices[0].nodes[0].path",
        ),
        (
            "discovery:\n  static_devices:\n    - {id: a, vendor: x}\n    - {id: a, vendor: x}\n",
            "discovery.static_devices[1].id",
        ),
    ] {
        match Config::from_yaml(text, "t") {
            Err(ConfigError::Invalid {
                field: f, position, ..
            }) => {
                assert_eq!(f, field, "{text}");
                assert!(position.is_some(), "{text}");
            }
            other => panic!("{text}: expected Invalid at {field}, got {other:?}"),
        }
    }
}

/// One device under two ids (issue 39, item 2): two static devices that share a device node
/// or a PCI address would both be published and granted, one GPU to two containers. Refused at
/// load, pointing at the second entry's field, naming both ids and what they share.
#[test]
fn two_static_devices_that_are_one_device_are_refused_naming_both() {
    let nodes = "\
discovery:
  static_devices:
    - { id: gpu0, vendor: nvidia, nodes: [{ path: /dev/nvidia0, major: 195, minor: 0 }] }
    - { id: gpu1, vendor: nvidia, nodes: [{ path: /dev/nvidia1, major: 195, minor: 1 }] }
    - id: alias
      vendor: nvidia
      nodes:
        - { path: /dev/nvidia-alias, major: 195, minor: 0 }
";
    let (field, position, message) = invalid(nodes);
    assert_eq!(field, "discovery.static_devices[2].nodes[0]");
    assert_eq!(position, at(8, 11));
    assert_eq!(
        message,
        "device \"alias\" has device node c 195:0 (/dev/nvidia-alias), which device \"gpu0\" (discovery.static_devices[0]) has too: one device under two ids would be granted twice; list each device once"
    );

    let pci = "\
discovery:
  static_devices:
    - { id: gpu0, vendor: nvidia, pci_address: \"0000:18:00.0\" }
    - { id: gpu1, vendor: nvidia, pci_address: \"0000:2A:00.0\" }
    - { id: alias, vendor: nvidia, pci_address: \"0000:2a:00.0\" }
";
    let (field, position, message) = invalid(pci);
    assert_eq!(field, "discovery.static_devices[2].pci_address");
    assert_eq!(position.map(|p| p.line), Some(5));
    assert_eq!(
        message,
        "device \"alias\" has PCI address 0000:2a:00.0, which device \"gpu1\" (discovery.static_devices[1]) has too: one device under two ids would be granted twice; list each device once"
    );

    // Control nodes are every device's of a vendor: sharing them is what they are for.
    let control = "\
discovery:
  static_devices:
    - { id: gpu0, vendor: nvidia, nodes: [{ path: /dev/nvidia0, major: 195, minor: 0 }], control_nodes: [{ path: /dev/nvidiactl, major: 195, minor: 255 }] }
    - { id: gpu1, vendor: nvidia, nodes: [{ path: /dev/nvidia1, major: 195, minor: 1 }], control_nodes: [{ path: /dev/nvidiactl, major: 195, minor: 255 }] }
";
    Config::from_yaml(control, "t").unwrap();
}

#[test]
fn a_full_config_round_trips_its_values() {
    let text = "\
state_dir: /srv/state
nri: {socket: /run/nri/nri.sock, plugin_name: gpu.accel, plugin_index: \"05\", cdi_injection: device-nodes}
claims_api: {socket: /run/x/claims.sock, group: gpu-operators, max_message_bytes: 65536}
cdi: {dir: /etc/cdi, vendor: example.com, class: gpu, format: json}
discovery: {sysfs: false, root: /host, cpus: \"0-7\"}
metrics: {listen: \"127.0.0.1:9464\"}
log: {level: debug, format: json}
reconcile_interval_secs: 0
";
    let cfg = Config::from_yaml(text, "full").unwrap();
    assert_eq!(cfg.nri.plugin_index, "05");
    assert_eq!(
        cfg.nri.cdi_injection,
        nri_accel::config::CdiInjection::DeviceNodes
    );
    assert_eq!(cfg.claims_api.group.as_deref(), Some("gpu-operators"));
    assert_eq!(cfg.cdi.format, nri_accel::config::SpecFormat::Json);
    assert!(!cfg.discovery.sysfs);
    assert_eq!(cfg.discovery.cpus, Some("0-7".parse().unwrap()));
    assert_eq!(cfg.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(cfg.log.level, nri_accel::config::LogLevel::Debug);
    assert_eq!(cfg.reconcile_interval_secs, 0);
}

#[test]
fn oversized_and_unreadable_files_are_refused_with_their_path() {
    let big = "# padding\n".repeat(120_000);
    assert!(matches!(err(&big), ConfigError::TooLarge { .. }));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, &big).unwrap();
    assert!(matches!(
        Config::load(&path),
        Err(ConfigError::TooLarge { .. })
    ));
    let missing = dir.path().join("missing.yaml");
    let e = Config::load(&missing).unwrap_err();
    assert!(e.to_string().contains("missing.yaml"), "{e}");
}

#[test]
fn alias_bombs_and_deep_nesting_hit_the_budget_not_the_memory() {
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..12 {
        let prev = if i == 0 {
            "a".to_string()
        } else {
            format!("b{}", i - 1)
        };
        bomb.push_str(&format!("b{i}: &b{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
    }
    assert!(matches!(err(&bomb), ConfigError::Syntax { .. }));
    let deep = format!("pools: {}{}\n", "[".repeat(200), "]".repeat(200));
    assert!(matches!(err(&deep), ConfigError::Syntax { .. }));
}

#[test]
fn multiple_documents_are_refused() {
    let e = err("log: {level: info}\n---\nlog: {level: debug}\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
}

const SLICED_POOLS: &str = "pools:
  - name: whole
    select: { ids: [g0] }
    family: { kind: exclusive }
  - name: mig
    select: { ids: [g1] }
    family:
      kind: sliced
      slots: 8
      profiles:
        - { name: 1g, size: 1, starts: [0, 1, 2, 3, 4, 5, 6, 7] }
        - { name: 4g, size: 4, starts: [0, 4] }
";

fn device_plugin_error(section: &str) -> (String, String) {
    match err(&format!("{SLICED_POOLS}device_plugin:\n{section}")) {
        ConfigError::Invalid { field, message, .. } => (field, message),
        other => panic!("{other:?}"),
    }
}

#[test]
fn device_plugin_layouts_and_names_are_checked_naming_the_pool() {
    let ok = Config::from_yaml(
        &format!(
            "{SLICED_POOLS}device_plugin:\n  enabled: true\n  slice_layouts:\n    mig:\n      - {{ profile: 4g, start: 0 }}\n      - {{ profile: 1g, start: 4 }}\n      - {{ profile: 1g, start: 7 }}\n"
        ),
        "t.yaml",
    )
    .unwrap();
    assert_eq!(ok.device_plugin.slice_layouts["mig"].len(), 3);

    let (field, m) = device_plugin_error(
        "  slice_layouts:\n    mig:\n      - { profile: 4g, start: 0 }\n      - { profile: 1g, start: 2 }\n",
    );
    assert_eq!(field, "device_plugin.slice_layouts");
    assert!(
        m.contains("pool \"mig\"") && m.contains("4g@0 and 1g@2 overlap at slot 2"),
        "{m}"
    );
    let (_, m) =
        device_plugin_error("  slice_layouts:\n    mig:\n      - { profile: 2g, start: 0 }\n");
    assert!(
        m.contains("pool \"mig\"") && m.contains("profile 2g is not defined"),
        "{m}"
    );
    let (_, m) =
        device_plugin_error("  slice_layouts:\n    whole:\n      - { profile: 1g, start: 0 }\n");
    assert!(
        m.contains("pool \"whole\"") && m.contains("only sliced pools"),
        "{m}"
    );
    let (_, m) =
        device_plugin_error("  slice_layouts:\n    gone:\n      - { profile: 1g, start: 0 }\n");
    assert!(m.contains("pool \"gone\", which is not defined"), "{m}");
    let (field, m) = device_plugin_error("  pools: [whole, nope]\n");
    assert_eq!(field, "device_plugin.pools[1]");
    assert!(m.contains("\"nope\""), "{m}");
    let (field, m) = device_plugin_error("  resource_prefix: Accel_Example\n");
    assert_eq!(field, "device_plugin.resource_prefix");
    assert!(m.contains("DNS subdomain"), "{m}");
    let (field, _) = device_plugin_error("  dir: relative/dir\n");
    assert_eq!(field, "device_plugin.dir");
    let e = err(&format!("{SLICED_POOLS}device_plugin:\n  unknown: 1\n"));
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
}

#[test]
fn the_device_plugin_daemonset_config_is_valid() {
    let manifest = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../packaging/kubernetes/nri-accel-device-plugin.yaml"),
    )
    .unwrap();
    let text: String = manifest
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("config.yaml: |"))
        .skip(1)
        .take_while(|l| *l != "---")
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let cfg = Config::from_yaml(&text, "daemonset").unwrap();
    assert!(cfg.device_plugin.enabled);
    assert_eq!(cfg.discovery.root, PathBuf::from("/host"));
}

#[test]
fn dra_pools_name_defined_pools() {
    let ok = Config::from_yaml(&format!("{SLICED_POOLS}dra:\n  pools: [mig]\n"), "t.yaml").unwrap();
    assert_eq!(ok.dra.pools, vec!["mig".to_string()]);
    match err(&format!("{SLICED_POOLS}dra:\n  pools: [mig, nope]\n")) {
        ConfigError::Invalid { field, message, .. } => {
            assert_eq!(field, "dra.pools[1]");
            assert!(
                message.contains("dra.pools names pool \"nope\", which is not defined in pools"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}
