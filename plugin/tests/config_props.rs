//! Properties of the config parser on arbitrary input: it never panics, and
//! every refusal carries the origin.

use nri_accel::config::{Config, ConfigError};
use proptest::prelude::*;

/// Fragments of plausible config text, so generated inputs reach deep into the parser.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("pools:\n".to_string()),
        Just("  - name: p\n".to_string()),
        Just(
            "    family: {kind: sliced, slots: 8, profiles: [{name: a, size: 9, starts: [0]}]}\n"
                .to_string()
        ),
        Just("    family: {kind: shared, replicas: 0}\n".to_string()),
        Just("nri: {plugin_index: \"1x\"}\n".to_string()),
        Just("discovery: {cpus: \"0-3\", static_devices: [{id: a, vendor: v}]}\n".to_string()),
        Just("&a [*a]\n".to_string()),
        Just("---\n".to_string()),
        "[ -~\n]{0,40}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = Config::from_yaml(&text, "fuzz.yaml");
    }

    #[test]
    fn config_like_text_is_accepted_or_refused_with_its_origin(parts in prop::collection::vec(fragment(), 0..8)) {
        let text: String = parts.concat();
        match Config::from_yaml(&text, "fuzz.yaml") {
            Ok(cfg) => prop_assert!(cfg.validate("again").is_ok()),
            Err(e @ (ConfigError::Syntax { .. } | ConfigError::Invalid { .. })) => {
                prop_assert!(e.to_string().starts_with("fuzz.yaml"), "{}", e);
            }
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
    }
}
