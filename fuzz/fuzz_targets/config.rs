//! The daemon's YAML config (`/etc/nri-accel/config.yaml`): parse and validate arbitrary text.
#![no_main]

use nri_accel::config::Config;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The loader reads the file as UTF-8 first; non-UTF-8 never reaches the parser.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = Config::from_yaml(text, "fuzz.yaml") {
        // A config that parsed must also pass its own validation again.
        assert!(cfg.validate("fuzz.yaml").is_ok());
    }
});
