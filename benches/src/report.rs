//! Results: `results.json` (one object per figure), `results.md` (absolute figures, ratios
//! to annal from the same run, and the targets), and SVG plots.

use crate::compare::{quantile, Scale};
use crate::stores::StoreKind;
use crate::Result;
use plotters::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// The metrics every store reports, whatever the scale.
pub const METRICS: [&str; 17] = [
    "commits_per_s",
    "commit_p50_us",
    "commit_p99_us",
    "commit_p999_us",
    "io_bytes_per_commit",
    "written_bytes_per_commit",
    "head_reads_per_s",
    "page_reads_per_s",
    "rebuild_events_per_s",
    "bytes_per_logical_byte_append_only",
    "bytes_per_logical_byte_compaction_heavy",
    "bytes_per_logical_byte_append_only_compacted",
    "bytes_per_logical_byte_compaction_heavy_compacted",
    "allocated_bytes_per_logical_byte_append_only",
    "allocated_bytes_per_logical_byte_compaction_heavy",
    "open_first_head_ms",
    "recovery_first_head_ms",
];

/// The first metrics of [`METRICS`] are measured at each number of committers.
const PER_LEVEL: usize = 6;

/// One figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Store name, or `machine`.
    pub store: String,
    /// Metric name.
    pub metric: String,
    /// Concurrent committers, for the commit metrics.
    pub committers: Option<u32>,
    /// The figure.
    pub value: f64,
    /// Its unit.
    pub unit: String,
}

impl Entry {
    /// A figure.
    pub fn new(store: &str, metric: &str, committers: Option<u32>, value: f64, unit: &str) -> Entry {
        Entry { store: store.into(), metric: metric.into(), committers, value, unit: unit.into() }
    }
}

/// Everything one run measured.
#[derive(Debug)]
pub struct Report {
    /// Every figure, in measurement order.
    pub entries: Vec<Entry>,
    /// Sorted commit latencies per (store, committers).
    pub latencies: BTreeMap<(String, u32), Vec<Duration>>,
    /// The disk's `fdatasync` ceiling.
    pub fsync_per_s: f64,
    /// Wall time of the run.
    pub elapsed: Duration,
    scale: Scale,
    seed: u64,
}

fn higher_is_better(metric: &str) -> bool {
    metric.ends_with("_per_s")
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        let s = format!("{v:.0}");
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl Report {
    /// An empty report.
    pub fn new(scale: &Scale, seed: u64) -> Report {
        Report {
            entries: Vec::new(),
            latencies: BTreeMap::new(),
            fsync_per_s: 0.0,
            elapsed: Duration::ZERO,
            scale: scale.clone(),
            seed,
        }
    }

    /// Adds a figure.
    pub fn push(&mut self, e: Entry) {
        self.entries.push(e);
    }

    /// The figure for (store, metric, committers), if measured.
    pub fn get(&self, store: &str, metric: &str, committers: Option<u32>) -> Option<f64> {
        self.entries
            .iter()
            .find(|e| e.store == store && e.metric == metric && e.committers == committers)
            .map(|e| e.value)
    }

    fn stores(&self) -> Vec<&'static str> {
        StoreKind::known().map(|k| k.name()).filter(|n| self.entries.iter().any(|e| e.store == *n)).collect()
    }

    /// The rows of the tables: (metric, committers) in a fixed order.
    fn rows(&self) -> Vec<(&'static str, Option<u32>)> {
        let mut rows = Vec::new();
        for metric in &METRICS[..PER_LEVEL] {
            for level in &self.scale.levels {
                rows.push((*metric, Some(*level as u32)));
            }
        }
        for metric in &METRICS[PER_LEVEL..] {
            rows.push((*metric, None));
        }
        rows
    }

    /// Writes `results.json`, `results.md` and the plots into `out`.
    pub fn write(&self, out: &Path) -> Result<()> {
        let json: Vec<_> = self
            .entries
            .iter()
            .map(|e| {
                json!({ "store": e.store, "metric": e.metric, "committers": e.committers, "value": e.value, "unit": e.unit })
            })
            .collect();
        std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&json)? + "\n")?;
        std::fs::write(out.join("results.md"), self.markdown())?;
        self.plot_throughput(&out.join("throughput.svg"))?;
        for level in &self.scale.levels {
            self.plot_cdf(*level as u32, &out.join(format!("latency_cdf_c{level}.svg")))?;
        }
        Ok(())
    }

    /// The markdown tables.
    pub fn markdown(&self) -> String {
        let stores = self.stores();
        let mut md = String::new();
        let _ = writeln!(
            md,
            "Scale `{}`, seed {}, run time {:.0} s. Disk ceiling: {} `fdatasync`/s (4 KiB rewrite in place), \
             {} /s (512 B append). Open-time database: {} events ({} sessions of {}).\n",
            self.scale.label,
            self.seed,
            self.elapsed.as_secs_f64(),
            fmt(self.fsync_per_s),
            fmt(self.get("machine", "append_fdatasync_per_s", None).unwrap_or(0.0)),
            fmt(self.scale.open_events() as f64),
            self.scale.open_sessions,
            self.scale.open_events_per_session,
        );
        let header = |md: &mut String, first: &str, cols: &[&str]| {
            let _ = writeln!(md, "| {first} | committers | {} |", cols.join(" | "));
            let _ = writeln!(md, "|---|---:|{}", "---:|".repeat(cols.len()));
        };
        let mut cols: Vec<&str> = stores.clone();
        cols.push("unit");
        header(&mut md, "metric", &cols);
        for (metric, c) in self.rows() {
            let unit = self.entries.iter().find(|e| e.metric == metric).map_or("", |e| e.unit.as_str());
            let cells: Vec<String> = stores.iter().map(|s| self.get(s, metric, c).map_or("-".into(), fmt)).collect();
            let level = c.map_or(String::new(), |c| c.to_string());
            let _ = writeln!(md, "| {metric} | {level} | {} | {unit} |", cells.join(" | "));
        }
        let others: Vec<&str> = stores.iter().copied().filter(|s| *s != "annal").collect();
        let _ = writeln!(
            md,
            "\nannal's advantage over each store, measured in the same run (× ; above 1 means annal is better):\n"
        );
        header(&mut md, "metric", &others);
        for (metric, c) in self.rows() {
            let cells: Vec<String> = others
                .iter()
                .map(|s| self.advantage(s, metric, c).map_or("-".into(), |r| format!("{r:.2}×")))
                .collect();
            let level = c.map_or(String::new(), |c| c.to_string());
            let _ = writeln!(md, "| {metric} | {level} | {} |", cells.join(" | "));
        }
        let _ = writeln!(md, "\nannal's group commit (`sync_data` calls counted by `FaultyBackend` with no faults):\n");
        let _ =
            writeln!(md, "| committers | commits/s | commits per fsync | ceiling × commits per fsync | share of it |");
        let _ = writeln!(md, "|---:|---:|---:|---:|---:|");
        for level in &self.scale.levels {
            let c = Some(*level as u32);
            if let (Some(rate), Some(per)) =
                (self.get("annal", "commits_per_s", c), self.get("annal", "commits_per_fsync", c))
            {
                let bound = self.fsync_per_s * per;
                let _ = writeln!(
                    md,
                    "| {level} | {} | {per:.2} | {} | {:.0}% |",
                    fmt(rate),
                    fmt(bound),
                    100.0 * rate / bound
                );
            }
        }
        let _ = writeln!(md, "\nTargets:\n");
        for (target, met, detail) in self.targets() {
            let _ = writeln!(md, "- {target}: **{}** ({detail})", if met { "met" } else { "missed" });
        }
        if let Some(floor) = self.floor() {
            let _ = writeln!(md, "\n{floor}");
        }
        if let Some(zstd) = self.zstd() {
            let _ = writeln!(md, "\n{zstd}");
        }
        md
    }

    /// Where the floor (`stores/floor.rs`: typed state in memory, no projection written)
    /// stands at 16 committers: the most a group-committing design reaches on this machine
    /// that day, against the baselines and annal.
    pub fn floor(&self) -> Option<String> {
        let c16 = Some(16);
        let floor = self.get("floor", "commits_per_s", c16)?;
        let mut parts = vec![format!("The floor at 16 committers: {} commits/s", fmt(floor))];
        for (store, label) in [("sqlite", "SQLite"), ("jsonl", "JSONL")] {
            if let Some(other) = self.get(store, "commits_per_s", c16) {
                parts.push(format!("{:.2}× {label}", floor / other));
            }
        }
        if let Some(annal) = self.get("annal", "commits_per_s", c16) {
            parts.push(format!("annal makes {:.0}% of it", 100.0 * annal / floor));
        }
        Some(parts.join("; ") + ".")
    }

    /// What annal's zstd content (`annal_zstd`, `Compression::Zstd`) changes against the
    /// default lz4 (`annal`), in the same run: commits, bytes written, file size and page
    /// reads.
    pub fn zstd(&self) -> Option<String> {
        let c16 = Some(16);
        let bytes = self.get("annal_zstd", "written_bytes_per_commit", c16)?;
        let mut parts = vec![format!(
            "annal with zstd content (`annal_zstd`) at 16 committers: {} bytes written per commit ({} 8 KiB; annal {})",
            fmt(bytes),
            if bytes <= 8192.0 { "within" } else { "over" },
            self.get("annal", "written_bytes_per_commit", c16).map_or("-".into(), fmt)
        )];
        for (metric, c, label) in [
            ("commits_per_s", Some(1), "commits/s at 1 committer"),
            ("commits_per_s", c16, "commits/s at 16"),
            ("page_reads_per_s", None, "page reads/s"),
            ("bytes_per_logical_byte_append_only", None, "file bytes per logical byte (append-only)"),
            ("bytes_per_logical_byte_append_only_compacted", None, "the same after compaction"),
        ] {
            if let (Some(z), Some(a)) = (self.get("annal_zstd", metric, c), self.get("annal", metric, c)) {
                let (z, a) =
                    if metric.starts_with("bytes") { (format!("{z:.2}"), format!("{a:.2}")) } else { (fmt(z), fmt(a)) };
                parts.push(format!("{label} {z} (annal {a})"));
            }
        }
        Some(parts.join("; ") + ".")
    }

    /// annal's advantage over `store`: above 1 means annal is better.
    pub fn advantage(&self, store: &str, metric: &str, c: Option<u32>) -> Option<f64> {
        let a = self.get("annal", metric, c)?;
        let b = self.get(store, metric, c)?;
        if a <= 0.0 || b <= 0.0 {
            return None;
        }
        Some(if higher_is_better(metric) { a / b } else { b / a })
    }

    /// Each target with whether it was met and the figures behind it.
    pub fn targets(&self) -> Vec<(String, bool, String)> {
        let mut out = Vec::new();
        let (c1, c16) = (Some(1), Some(16));
        for (store, label, min) in [("sqlite", "SQLite", 8.0), ("jsonl", "per-session JSONL with fsync", 1.5)] {
            if let Some(r) = self.advantage(store, "commits_per_s", c16) {
                out.push((format!("durable commits at 16 committers ≥ {min}× {label}"), r >= min, format!("{r:.2}×")));
            }
        }
        if let Some(r) = self.advantage("sqlite", "commits_per_s", c1) {
            out.push(("durable commits at 1 committer ≥ 1.0× SQLite".into(), r >= 1.0, format!("{r:.2}×")));
        }
        if let (Some(a), Some(b)) =
            (self.get("annal", "commit_p50_us", c1), self.get("redb_insert", "commit_p50_us", c1))
        {
            out.push((
                "commit latency at 1 committer ≤ 1.3× a bare redb single-insert durable commit \
                 (p50, same concurrency mode)"
                    .into(),
                a <= 1.3 * b,
                format!("{} µs vs {} µs: {:.2}×", fmt(a), fmt(b), a / b.max(1e-9)),
            ));
        }
        if let (Some(a), Some(s)) = (self.get("annal", "commit_p99_us", c16), self.get("sqlite", "commit_p99_us", c16))
        {
            out.push(("p99 at 16 committers ≤ SQLite's p99".into(), a <= s, format!("{} µs vs {} µs", fmt(a), fmt(s))));
        }
        if let (Some(p999), Some(p99)) =
            (self.get("annal", "commit_p999_us", c16), self.get("annal", "commit_p99_us", c16))
        {
            out.push((
                "p999 at 16 committers ≤ 3× annal's p99 (no checkpoint stall)".into(),
                p999 <= 3.0 * p99,
                format!("{} µs vs {} µs: {:.2}×", fmt(p999), fmt(p99), p999 / p99.max(1e-9)),
            ));
        }
        if let Some(b) = self.get("annal", "written_bytes_per_commit", c16) {
            let by_file: Vec<String> = self
                .entries
                .iter()
                .filter(|e| e.store == "annal" && e.committers == c16)
                .filter_map(|e| {
                    Some(format!("{} {}", e.metric.strip_prefix("written_bytes_per_commit_")?, fmt(e.value)))
                })
                .collect();
            let by_file = if by_file.is_empty() { String::new() } else { format!(": {}", by_file.join(", ")) };
            out.push((
                "bytes written per commit at 16 committers ≤ 8 KiB (every file, every checkpoint)".into(),
                b <= 8192.0,
                format!("{} bytes{by_file}", fmt(b)),
            ));
        }
        for shape in ["append_only", "compaction_heavy"] {
            let rows = self.get("annal", &format!("projection_rows_per_event_{shape}"), None);
            let bytes = self.get("annal", &format!("projection_bytes_per_event_{shape}"), None);
            if let (Some(rows), Some(bytes)) = (rows, bytes) {
                let what = shape.replace('_', "-");
                out.push((format!("projection rows per event ≤ 1.5 ({what})"), rows <= 1.5, format!("{rows:.2} rows")));
                out.push((
                    format!("projection bytes per event ≤ 150 ({what})"),
                    bytes <= 150.0,
                    format!("{bytes:.0} bytes"),
                ));
            }
        }
        for shape in ["append_only", "compaction_heavy"] {
            let metric = format!("bytes_per_logical_byte_{shape}");
            if let (Some(a), Some(s)) = (self.get("annal", &metric, None), self.get("sqlite", &metric, None)) {
                let what = shape.replace('_', "-");
                out.push((
                    format!("file bytes per logical byte ≤ 1.0 and ≤ 0.8× SQLite's, as written ({what})"),
                    a <= 1.0 && a <= 0.8 * s,
                    format!("{a:.2} vs SQLite {s:.2}: {:.2}×", a / s.max(1e-9)),
                ));
            }
        }
        if let Some(r) = self.advantage("sqlite", "head_reads_per_s", None) {
            out.push(("head reads ≥ 5× SQLite".into(), r >= 5.0, format!("{r:.2}×")));
        }
        if let Some(r) = self.advantage("sqlite", "page_reads_per_s", None) {
            out.push(("transcript page reads ≥ 1.5× SQLite".into(), r >= 1.5, format!("{r:.2}×")));
        }
        if let Some(r) = self.advantage("sqlite", "rebuild_events_per_s", None) {
            out.push(("rebuild ≥ 2× SQLite (events/s)".into(), r >= 2.0, format!("{r:.2}×")));
        }
        if let Some(ms) = self.get("annal", "recovery_first_head_ms", None) {
            out.push((
                "open after SIGKILL with a full delta unflushed ≤ 1 s".into(),
                ms <= 1000.0,
                format!("{} ms for {} events", fmt(ms), fmt(self.get("annal", "recovery_events", None).unwrap_or(0.0))),
            ));
        }
        out
    }

    fn plot_throughput(&self, path: &Path) -> Result<()> {
        let stores = self.stores();
        let levels: Vec<u32> = self.scale.levels.iter().map(|l| *l as u32).collect();
        let values: Vec<f64> = self.entries.iter().filter(|e| e.metric == "commits_per_s").map(|e| e.value).collect();
        let y_max = values.iter().copied().fold(self.fsync_per_s, f64::max) * 2.0;
        let y_min = values.iter().copied().fold(f64::MAX, f64::min).min(self.fsync_per_s) / 2.0;
        let x_max = *levels.last().unwrap_or(&64) as f64 * 1.3;
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Durable commits per second vs concurrent committers", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d((0.8f64..x_max).log_scale(), (y_min.max(1.0)..y_max).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("concurrent committers")
            .y_desc("durable commits/s (log)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, store) in stores.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = levels
                .iter()
                .filter_map(|l| self.get(store, "commits_per_s", Some(*l)).map(|v| (*l as f64, v)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)).point_size(4))
                .map_err(|e| e.to_string())?
                .label(*store)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        let ceiling = self.fsync_per_s;
        chart
            .draw_series(LineSeries::new(vec![(0.8, ceiling), (x_max, ceiling)], BLACK.stroke_width(1)))
            .map_err(|e| e.to_string())?
            .label("disk fdatasync ceiling")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(1)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn plot_cdf(&self, level: u32, path: &Path) -> Result<()> {
        let stores = self.stores();
        let series: Vec<(&str, &Vec<Duration>)> =
            stores.iter().filter_map(|s| self.latencies.get(&(s.to_string(), level)).map(|l| (*s, l))).collect();
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        let lo = series.iter().filter_map(|(_, l)| l.first()).map(ms).fold(f64::MAX, f64::min).max(1e-3) / 1.5;
        let hi = series.iter().filter_map(|(_, l)| l.last()).map(ms).fold(0.0, f64::max).max(lo * 10.0) * 1.5;
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("Commit latency CDF, {level} concurrent committers"), ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("commit latency, ms (log)")
            .y_desc("fraction of commits")
            .x_label_formatter(&|x| if *x >= 1.0 { format!("{x:.0}") } else { format!("{x:.2}") })
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (store, lat)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let n = lat.len();
            let steps = n.min(400);
            let points: Vec<(f64, f64)> = (1..=steps)
                .map(|k| {
                    let q = k as f64 / steps as f64;
                    (ms(&quantile(lat, q)), q)
                })
                .collect();
            let label = format!("{store} (p99 {:.2} ms)", ms(&quantile(lat, 0.99)));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report holding `entries` only.
    fn report(entries: &[(&str, &str, Option<u32>, f64)]) -> Report {
        let mut r = Report::new(&Scale::tiny(), 42);
        for (store, metric, c, value) in entries {
            r.push(Entry::new(store, metric, *c, *value, "-"));
        }
        r
    }

    /// Whether the target whose name starts with `name` was met, and its figures.
    fn target(r: &Report, name: &str) -> Option<(bool, String)> {
        r.targets().into_iter().find(|(t, _, _)| t.starts_with(name)).map(|(_, met, detail)| (met, detail))
    }

    const LATENCY: &str = "commit latency at 1 committer ≤ 1.3× a bare redb single-insert durable commit";

    #[test]
    fn latency_against_the_bare_redb_insert() {
        let figures = |annal| {
            report(&[("annal", "commit_p50_us", Some(1), annal), ("redb_insert", "commit_p50_us", Some(1), 800.0)])
        };
        assert_eq!(target(&figures(1000.0), LATENCY), Some((true, "1,000 µs vs 800 µs: 1.25×".into())));
        assert_eq!(target(&figures(1120.0), LATENCY), Some((false, "1,120 µs vs 800 µs: 1.40×".into())));
        // Figures at another level, or no bare insert at all, give no line.
        let other_level =
            report(&[("annal", "commit_p50_us", Some(16), 900.0), ("redb_insert", "commit_p50_us", Some(16), 800.0)]);
        assert_eq!(target(&other_level, LATENCY), None);
        assert_eq!(target(&report(&[("annal", "commit_p50_us", Some(1), 900.0)]), LATENCY), None);
    }

    #[test]
    fn page_reads_and_rebuild_against_sqlite() {
        let met = report(&[
            ("annal", "page_reads_per_s", None, 30_000.0),
            ("sqlite", "page_reads_per_s", None, 20_000.0),
            ("annal", "rebuild_events_per_s", None, 200_000.0),
            ("sqlite", "rebuild_events_per_s", None, 100_000.0),
        ]);
        assert_eq!(target(&met, "transcript page reads ≥ 1.5× SQLite"), Some((true, "1.50×".into())));
        assert_eq!(target(&met, "rebuild ≥ 2× SQLite (events/s)"), Some((true, "2.00×".into())));
        let missed = report(&[
            ("annal", "page_reads_per_s", None, 19_594.0),
            ("sqlite", "page_reads_per_s", None, 38_262.0),
            ("annal", "rebuild_events_per_s", None, 28_021.0),
            ("sqlite", "rebuild_events_per_s", None, 93_787.0),
        ]);
        assert_eq!(target(&missed, "transcript page reads ≥ 1.5× SQLite"), Some((false, "0.51×".into())));
        assert_eq!(target(&missed, "rebuild ≥ 2× SQLite (events/s)"), Some((false, "0.30×".into())));
    }

    #[test]
    fn targets_keep_their_order() {
        let r = report(&[
            ("annal", "commits_per_s", Some(1), 1000.0),
            ("sqlite", "commits_per_s", Some(1), 2000.0),
            ("annal", "commit_p50_us", Some(1), 1000.0),
            ("redb_insert", "commit_p50_us", Some(1), 800.0),
            ("annal", "head_reads_per_s", None, 1e7),
            ("sqlite", "head_reads_per_s", None, 1e6),
            ("annal", "page_reads_per_s", None, 1e4),
            ("sqlite", "page_reads_per_s", None, 1e4),
            ("annal", "rebuild_events_per_s", None, 1e4),
            ("sqlite", "rebuild_events_per_s", None, 1e4),
        ]);
        let names: Vec<String> = r.targets().into_iter().map(|(t, _, _)| t).collect();
        let position = |prefix: &str| names.iter().position(|t| t.starts_with(prefix)).unwrap();
        assert_eq!(position(LATENCY), position("durable commits at 1 committer") + 1);
        assert_eq!(position("transcript page reads"), position("head reads") + 1);
        assert_eq!(position("rebuild"), position("transcript page reads") + 1);
    }
}
