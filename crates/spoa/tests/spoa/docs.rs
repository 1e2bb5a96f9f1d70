//! `docs/spoa.md` shows the HAProxy configuration the tests run, exactly.

#[test]
fn documented_haproxy_config_is_the_tested_one() {
    let doc = std::fs::read_to_string(crate::support::crate_dir().join("../../docs/spoa.md"))
        .expect("docs/spoa.md");
    for path in [
        crate::support::haproxy::config_path(),
        crate::support::haproxy::spoe_path(),
    ] {
        let text = std::fs::read_to_string(&path).expect("config file");
        assert!(
            doc.contains(&text),
            "docs/spoa.md must contain {} verbatim",
            path.display()
        );
    }
}
