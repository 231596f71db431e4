//! The model test: random command sequences run against a real [`Engine`] and against
//! an independent in-memory model of SPEC §6 (`model/reference.rs`). They must agree on
//! every command's outcome or exact rejection, and, at checkpoints and at the end, on
//! every query: heads, listings, transcript pages at the head and at every revision the
//! model recorded, revision pages and graphs, context, usage, the tool ledger, the
//! event log's seq and stream density, and the content objects. Then the projections
//! are rebuilt from the log and must be byte-identical, and so must they be after a
//! close and a reopen.
//!
//! Each case opens the engine with a random checkpoint policy (eager, lazy, the default,
//! or a delta bound small enough that the writer waits for the checkpointer), so queries
//! read every mix of checkpoint and delta. Sequences also hold checkpoint points
//! ([`Engine::checkpoint`]: the delta empties, every query still agrees) and reopen
//! points: close, then keep the projections file, delete it (the open rebuilds it), or
//! put back a copy taken at an earlier close (the open folds the log past it, as after a
//! crash that left the delta since then unflushed), and open again with another random
//! policy. After a reopen the open must have folded exactly the events the projections
//! file lacked, every query agrees, and the projections equal a rebuild from the log.
//!
//! Purge points close the engine and purge a session (with or without its fork
//! descendants) through [`annal::purge()`]: the engine's report or rejection must equal
//! the model's (`NotFound`, `Purged`, `HasForks`, the tombstones' seqs), and after the
//! reopen the purged sessions answer `Purged { session, seq }`, every other query and the
//! content the remaining sessions reach agree, and the projections equal a rebuild.
//! Collection points run the online collection ([`annal::Engine::collect_garbage`]) in
//! batches of a few rows: it must remove nothing (nothing in a database the engine wrote
//! is unreachable, whatever the sharing) and change no answer.
//!
//! `PROPTEST_CASES` overrides the number of cases (256 by default).

#[path = "model/check.rs"]
mod check;
#[path = "model/ops.rs"]
mod ops;
#[path = "model/reference.rs"]
mod reference;

use annal::*;
use check::{compare_all, execute, learn_clock, ok, same, Checked};
use ops::{limits, policy, resolve, sequence, AtOpen, History, Op, Policy};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use reference::{carried_content, Model};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Default number of cases; `PROPTEST_CASES` overrides it.
const CASES_DEFAULT: u32 = 256;
/// Operations per case at most.
const OPS_MAX: usize = 40;
/// A full comparison runs after this many operations, besides the generated checks.
const CHECK_EVERY_OPS: usize = 16;

fn options(policy: Policy, clock: &ManualClock) -> Options {
    Options {
        limits: limits(),
        durability: Durability::Relaxed,
        checkpoint: policy.checkpoint(),
        clock: std::sync::Arc::new(clock.clone()),
        ..Options::default()
    }
}

fn open(path: &Path, policy: Policy, clock: &ManualClock) -> Checked<Engine> {
    ok(Engine::open_with(path, options(policy, clock)), "open")
}

fn io<T>(r: std::io::Result<T>, what: &str) -> Checked<T> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))
}

/// Checks the projections against a rebuild from the log (which leaves them rebuilt).
fn equal_a_rebuild(engine: &Engine, when: &str) -> Checked {
    let digests = ok(engine.projection_digests(), "digests")?;
    ok(engine.rebuild(ProjectionSet::all()), "rebuild")?;
    same(ok(engine.projection_digests(), "digests")?, digests, format_args!("{when}: projections equal a rebuild"))
}

/// A case's database file, and the copies of its projections file taken at each close.
struct Files {
    path: PathBuf,
    saved: Vec<Saved>,
}

/// A copy of the projections file taken at a close, and the log tip it holds.
struct Saved {
    path: PathBuf,
    seq: u64,
}

/// Closes `engine`, does `at_open` to the projections file, opens the database again
/// with `policy`, and checks that the open folded exactly the events the file lacked,
/// every query, and the projections against a rebuild. Returns the new engine.
fn reopen(
    engine: Engine,
    files: &mut Files,
    policy: Policy,
    at_open: AtOpen,
    model: &mut Model,
    never_stored: &BTreeSet<ContentId>,
    when: &str,
) -> Checked<Engine> {
    ok(engine.close(), "close")?;
    // Lease renewals live in the writer's memory.
    model.renewals.clear();
    let file = projections_path(&files.path);
    // Close checkpointed the whole delta: the file holds every event.
    let copy = files.path.with_extension(format!("projections.{}", files.saved.len()));
    io(std::fs::copy(&file, &copy), "copy the projections file")?;
    let folded = match at_open {
        AtOpen::Keep => 0,
        AtOpen::Delete => {
            io(std::fs::remove_file(&file), "delete the projections file")?;
            model.seq
        }
        AtOpen::Stale(_) if files.saved.is_empty() => 0,
        AtOpen::Stale(n) => {
            let old = &files.saved[n as usize % files.saved.len()];
            io(std::fs::copy(&old.path, &file), "put back an old projections file")?;
            model.seq - old.seq
        }
    };
    files.saved.push(Saved { path: copy, seq: model.seq });
    let engine = open(&files.path, policy, &model.time)?;
    same(engine.stats().recovered_events, folded, format_args!("{when}: events folded at open"))?;
    same(ok(engine.tip(), "tip")?.0, model.seq, format_args!("{when}: log tip"))?;
    compare_all(&engine, model, never_stored, when)?;
    equal_a_rebuild(&engine, when)?;
    Ok(engine)
}

fn run(first: Policy, ops: &[Op]) -> Checked {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut files = Files { path: dir.path().join("model.redb"), saved: Vec::new() };
    let mut policy = first;
    let mut model = Model::new(limits());
    let mut engine = open(&files.path, policy, &model.time)?;
    let mut history = History::default();
    let mut never_stored = BTreeSet::new();
    for (step, op) in ops.iter().enumerate() {
        if matches!(op, Op::Check) || (step + 1) % CHECK_EVERY_OPS == 0 {
            compare_all(&engine, &model, &never_stored, &format!("before step {step}"))?;
        }
        match op {
            Op::Check => continue,
            Op::Advance { ms } => {
                model.time.advance(u64::from(*ms));
                continue;
            }
            Op::Checkpoint => {
                ok(engine.checkpoint(), "checkpoint")?;
                same(engine.stats().delta_bytes, 0, format_args!("step {step}: delta bytes after a checkpoint"))?;
                compare_all(&engine, &model, &never_stored, &format!("after the checkpoint at step {step}"))?;
                continue;
            }
            Op::Purge { s, descendants, policy: next } => {
                let id = ops::target(&model, *s);
                ok(engine.close(), "close")?;
                let mut request = PurgeRequest::new(id, "model", "model");
                request.descendants = *descendants;
                let got = annal::purge(&files.path, options(*next, &model.time), &request).map(|r| r.purged);
                // The purge's open rebuilt the projections file; copies saved before it
                // hold erased rows and belong to another log.
                files.saved.clear();
                engine = open(&files.path, *next, &model.time)?;
                policy = *next;
                // The close and the reopen forget the renewals.
                model.renewals.clear();
                learn_clock(&engine, &mut model)?;
                let want = model.purge(&id, *descendants).map_err(Error::Rejected);
                same(&got, &want, format_args!("step {step}: purge {id} (descendants: {descendants})"))?;
                same(ok(engine.tip(), "tip")?.0, model.seq, format_args!("step {step}: log tip after a purge"))?;
                for (purged, seq) in want.iter().flatten() {
                    let answer = engine.head(*purged).map(|_| ());
                    let expected = Err(Error::Rejected(Rejection::Purged { session: *purged, seq: *seq }));
                    same(&answer, &expected, format_args!("step {step}: head of purged {purged}"))?;
                }
                compare_all(&engine, &model, &never_stored, &format!("after the purge at step {step}"))?;
                equal_a_rebuild(&engine, &format!("after the purge at step {step}"))?;
                continue;
            }
            Op::Collect { rows } => {
                // The model's database never holds content that nothing reaches (a purge
                // collects as it goes): an online collection must find nothing, however
                // the sessions share objects, and change no answer.
                let report = ok(engine.collect_garbage(usize::from(*rows)), "collect")?;
                same(report.objects_removed, 0, format_args!("step {step}: objects an online collection removed"))?;
                compare_all(&engine, &model, &never_stored, &format!("after the collection at step {step}"))?;
                continue;
            }
            Op::Reopen { policy: next, projections } => {
                let when = format!("after the reopen at step {step} ({projections:?}, {policy:?} -> {next:?})");
                engine = reopen(engine, &mut files, *next, *projections, &mut model, &never_stored, &when)?;
                policy = *next;
                continue;
            }
            _ => {}
        }
        let command = resolve(op, &model, &history);
        let (command, got) = execute(&engine, command);
        learn_clock(&engine, &mut model)?;
        let want = model.apply(&command).map_err(Error::Rejected);
        same(&got, &want, format_args!("step {step}: {command:#?}"))?;
        history.record(&command, want.as_ref().ok());
        same(ok(engine.tip(), "tip")?.0, model.seq, format_args!("step {step}: log tip"))?;
        if want.is_err() {
            never_stored.extend(carried_content(&command));
        }
    }
    compare_all(&engine, &model, &never_stored, "at the end")?;
    let digests = ok(engine.projection_digests(), "digests")?;
    ok(engine.rebuild(ProjectionSet::all()), "rebuild")?;
    same(ok(engine.projection_digests(), "digests")?, digests.clone(), "projections after a rebuild")?;
    compare_all(&engine, &model, &never_stored, "after a rebuild")?;
    ok(engine.close(), "close")?;
    model.renewals.clear();
    let engine = open(&files.path, policy, &model.time)?;
    same(ok(engine.projection_digests(), "digests")?, digests, "projections after a reopen")?;
    compare_all(&engine, &model, &never_stored, "after a reopen")?;
    ok(engine.close(), "close")
}

proptest! {
    #![proptest_config(check::config(CASES_DEFAULT))]

    #[test]
    fn engine_agrees_with_the_model(first in policy(), ops in sequence(OPS_MAX)) {
        run(first, &ops)?;
    }
}
