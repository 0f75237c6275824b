//! The differential fuzzer at a fixed seed: random Services through the real
//! compiler and map writer, 100,000 random packets through the TC program with
//! BPF_PROG_TEST_RUN, each compared with the reference model (verdict, exit reason,
//! bytes, checksums, conntrack) and checked against issue 13's invariants. Longer
//! runs: `cargo xtask fuzz --packets N [--seed S]`. Regression fixtures of
//! mismatches the fuzzer found follow. Needs root.

use sliceway_lab::fuzz::{self, Config};

#[test]
fn a_fixed_seed_run_of_100_000_packets_matches_the_model() {
    let config = Config {
        packets: 100_000,
        seed: 13,
        ..Config::default()
    };
    let report = fuzz::run(&config, |_| {}).unwrap();
    println!("{report}");
    assert_eq!(report.mismatches, 0, "{report}");
    // The run reached the paths it is meant to: new and tracked flows, replies,
    // fragments, ICMP errors, rejects, malformed packets, pods masqueraded to
    // external IPs and their ports running out.
    for reason in [
        "dnat_new",
        "dnat_masqueraded",
        "drop_snat_exhausted",
        "dnat_established",
        "revnat",
        "nat_fragment",
        "nat_icmp_error",
        "reject_no_backend",
        "reject_no_port",
        "drop_malformed",
        "drop_fragment_orphan",
        "pass_no_service",
        "pass_not_ipv4",
        "pass_not_l4",
    ] {
        assert!(
            report.reasons.get(reason).copied().unwrap_or(0) > 0,
            "no packet took {reason}:\n{report}"
        );
    }
}

/// Found by the fuzzer (seed 1): the first fragment of a UDP datagram to a
/// ClusterIP on a port its Service does not declare is rejected, and the program
/// passed the rest of the datagram to the ClusterIP untranslated (`pass_fragment`);
/// it is dropped as an orphan now (issue 13: never passed to a VIP untranslated).
#[test]
fn fuzz_seed_1_later_fragments_to_an_undeclared_clusterip_port_are_dropped() {
    fuzz::replay(&fuzz::Fixture {
        manifests: r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
"#,
        timeouts: [0; dataplane_common::ct::state::COUNT as usize],
        packets: &[
            // 10.244.9.2:40000 > 10.96.0.10:53 UDP, first fragment (rejected), then
            // the second (dropped).
            "02000000000202000000000108004500002c424220004011fa1f0af409020a60000a9c4000350030c727000102030405060708090a0b0c0d0e0f",
            "02000000000202000000000108004500002c4242000340111a1d0af409020a60000a101112131415161718191a1b1c1d1e1f2021222324252627",
        ],
    })
    .unwrap();
}
