//! The comparison harness runs end to end at a tiny size and writes every figure. This
//! checks that the harness works, not how fast anything is.

use annal_benches::compare::{run, Config, Scale};
use annal_benches::report::METRICS;
use annal_benches::stores::StoreKind;

#[test]
fn tiny_compare_writes_every_store_and_metric() {
    let out = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = Config::new(Scale::tiny(), out.path());
    config.data_dir = Some(data.path().to_path_buf());
    let report = run(&config).unwrap();

    let text = std::fs::read_to_string(out.path().join("results.json")).unwrap();
    let results: serde_json::Value = serde_json::from_str(&text).unwrap();
    let results = results.as_array().unwrap();
    for store in StoreKind::ALL {
        for metric in METRICS {
            // Only annal's backend (and the commit-phase-only floor and bare redb insert)
            // count their own bytes, recovery is timed for the default options alone, and
            // the floor and the bare redb insert only commit.
            let own_bytes = ["written_bytes_per_commit"].contains(&metric);
            let commit_metric = metric.starts_with("commit") || metric.ends_with("_per_commit");
            if (own_bytes && !store.name().starts_with("annal") && !store.commits_only())
                || (metric.starts_with("recovery") && store != StoreKind::Annal)
                || (store.commits_only() && !commit_metric)
            {
                continue;
            }
            let found = results.iter().filter(|r| r["store"] == store.name() && r["metric"] == metric).count();
            assert!(found > 0, "no {metric} for {}", store.name());
        }
        for level in &config.scale.levels {
            assert!(
                results.iter().any(|r| r["store"] == store.name()
                    && r["metric"] == "commits_per_s"
                    && r["committers"] == *level as u64),
                "no commits_per_s at {level} committers for {}",
                store.name()
            );
        }
    }
    for r in results {
        assert!(r["value"].as_f64().is_some_and(f64::is_finite), "{r}");
        assert!(r["unit"].is_string(), "{r}");
    }
    assert!(results.iter().any(|r| r["store"] == "machine" && r["metric"] == "fdatasync_per_s"));
    assert!(results.iter().any(|r| r["store"] == "annal" && r["metric"] == "commits_per_fsync"));
    // annal's bytes by file add up to its total, at every level.
    for level in &config.scale.levels {
        let c = Some(*level as u32);
        let total = report.get("annal", "written_bytes_per_commit", c).unwrap();
        let files: Vec<f64> = ["journal", "log", "projections"]
            .iter()
            .map(|f| report.get("annal", &format!("written_bytes_per_commit_{f}"), c).unwrap())
            .collect();
        assert!(files.iter().all(|b| *b > 0.0), "{files:?}");
        assert!((files.iter().sum::<f64>() - total).abs() < 1e-6 * total.max(1.0), "{files:?} against {total}");
    }

    // Every store folded the same number of events from the same workload.
    let stores = || StoreKind::ALL.into_iter().filter(|s| !s.commits_only());
    let rebuilt: Vec<f64> = stores().map(|s| report.get(s.name(), "rebuild_events", None).unwrap()).collect();
    assert!(rebuilt.iter().all(|e| *e == rebuilt[0]), "{rebuilt:?}");
    // ... and served the same transcript pages.
    let paged: Vec<f64> = stores().map(|s| report.get(s.name(), "page_bytes_read", None).unwrap()).collect();
    assert!(paged.iter().all(|b| *b == paged[0]), "{paged:?}");

    for file in ["results.md", "throughput.svg", "latency_cdf_c16.svg"] {
        let bytes = std::fs::read(out.path().join(file)).unwrap();
        assert!(!bytes.is_empty(), "{file} is empty");
    }
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(md.contains("| commits_per_s | 16 |"), "{md}");
    assert!(md.contains("The floor at 16 committers:"), "{md}");
    assert!(md.contains("annal with zstd content (`annal_zstd`) at 16 committers: "), "{md}");
    for target in [
        "- commit latency at 1 committer ≤ 1.3× a bare redb single-insert durable commit (p50, same concurrency mode): **",
        "- transcript page reads ≥ 1.5× SQLite: **",
        "- rebuild ≥ 2× SQLite (events/s): **",
    ] {
        assert!(md.contains(target), "no {target:?} in {md}");
    }
}
