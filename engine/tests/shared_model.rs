//! The model test on a shared log: the same random command sequences as `model.rs`, each
//! command sent to one of two hosts of one `RedbStream`, against the same in-memory
//! reference model. Every outcome or rejection must equal the model's; at checks and at
//! the end, every query on the first host agrees with the model, and the second holds
//! the same log and projections. Reopen points close a host and reopen it on its files, or
//! delete them (a new host folds the stream from its first message). Purges and content
//! collections are not available on a shared log and are skipped.
//!
//! A host keeps lease renewals and drafts in its own memory (design §13), so commands
//! that read or change them (leases, claims, fenced commands, drafts, a turn that
//! finalizes a draft) always go to the first host; the others go to either.
//!
//! `PROPTEST_CASES` overrides the number of cases (64 by default).

#[path = "model/check.rs"]
mod check;
// Purge and collection points are generated but skipped here.
#[allow(dead_code)]
#[path = "model/ops.rs"]
mod ops;
#[path = "model/reference.rs"]
mod reference;

use annal::backend::{LogBackend, RedbStream};
use annal::*;
use check::{compare_all, execute, learn_clock, ok, same, Checked};
use ops::{limits, policy, resolve, sequence, AtOpen, History, Op, Policy};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use reference::{carried_content, Model};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const CASES_DEFAULT: u32 = 64;
const OPS_MAX: usize = 40;
const CHECK_EVERY_OPS: usize = 16;

fn open(path: &Path, policy: Policy, clock: &ManualClock, stream: &RedbStream) -> Checked<Engine> {
    let options = Options {
        limits: limits(),
        checkpoint: policy.checkpoint(),
        clock: Arc::new(clock.clone()),
        ..Options::default()
    };
    let backend: Arc<dyn LogBackend> = Arc::new(stream.clone());
    ok(Engine::open_shared(path, options, backend), "open a host")
}

fn io<T>(r: std::io::Result<T>, what: &str) -> Checked<T> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))
}

/// Waits until `host` has folded every message of the stream.
fn caught_up(host: &Engine, stream: &RedbStream) -> Checked {
    let tip = stream.tip().map_err(|e| TestCaseError::fail(e.to_string()))?;
    match host.wait_for_stream(tip, Duration::from_secs(30)) {
        true => Ok(()),
        false => Err(TestCaseError::fail(format!("a host did not fold the stream to {tip}"))),
    }
}

/// Whether `command` reads or changes what a host keeps in memory.
fn host_bound(command: &Command) -> bool {
    match command {
        Command::Batch(members) => members.iter().any(host_bound),
        Command::Fenced { .. }
        | Command::AcquireLease(_)
        | Command::RenewLease(_)
        | Command::ReleaseLease { .. }
        | Command::ClaimInputs(_)
        | Command::AppendDraft(_)
        | Command::DiscardDraft { .. } => true,
        Command::CommitTurn(c) => c.draft.is_some() || !c.inputs.is_empty(),
        _ => false,
    }
}

/// Both hosts agree with the model, and with each other. Every query of the first host
/// is compared with the model; the second, whose drafts and lease renewals are its own,
/// must hold the same log (every event, the chain tip) and the same projections.
fn both_agree(
    hosts: &[Engine; 2],
    stream: &RedbStream,
    model: &Model,
    never: &BTreeSet<ContentId>,
    when: &str,
) -> Checked {
    for h in hosts {
        caught_up(h, stream)?;
    }
    compare_all(&hosts[0], model, never, &format!("{when}, the first host"))?;
    let digests = |h: &Engine| ok(h.projection_digests(), "digests");
    same(digests(&hosts[1])?, digests(&hosts[0])?, format_args!("{when}: the hosts' projections"))?;
    same(ok(hosts[1].tip(), "tip")?, ok(hosts[0].tip(), "tip")?, format_args!("{when}: the hosts' chain tips"))?;
    same(events(&hosts[1])?, events(&hosts[0])?, format_args!("{when}: the hosts' events"))
}

/// Every event of a host's log, page by page.
fn events(host: &Engine) -> Checked<Vec<StoredEvent>> {
    let mut out = Vec::new();
    let mut from_seq = 1;
    loop {
        let page = ok(host.events(EventQuery { from_seq, max_events: 50, max_bytes: 1 << 16 }), "events")?;
        out.extend(page.events);
        if !page.has_more {
            return Ok(out);
        }
        from_seq = page.next_seq;
    }
}

fn run(first: Policy, ops: &[Op], routes: &[bool]) -> Checked {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let stream = RedbStream::memory().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let paths: [PathBuf; 2] = [dir.path().join("a.redb"), dir.path().join("b.redb")];
    let mut model = Model::new(limits());
    let mut hosts = [open(&paths[0], first, &model.time, &stream)?, open(&paths[1], first, &model.time, &stream)?];
    let mut history = History::default();
    let mut never_stored = BTreeSet::new();
    for (step, op) in ops.iter().enumerate() {
        if matches!(op, Op::Check) || (step + 1) % CHECK_EVERY_OPS == 0 {
            both_agree(&hosts, &stream, &model, &never_stored, &format!("before step {step}"))?;
        }
        let route = usize::from(routes[step % routes.len()]);
        match op {
            Op::Check | Op::Purge { .. } | Op::Collect { .. } => continue,
            Op::Advance { ms } => {
                model.time.advance(u64::from(*ms));
                continue;
            }
            Op::Checkpoint => {
                ok(hosts[route].checkpoint(), "checkpoint")?;
                continue;
            }
            Op::Reopen { policy: next, projections } => {
                // The first host keeps the renewals the model knows of: the second reopens.
                let [a, b] = hosts;
                ok(b.close(), "close")?;
                if matches!(projections, AtOpen::Delete) {
                    // A new host in its place: it folds the stream from its first message.
                    for p in [paths[1].clone(), projections_path(&paths[1])] {
                        io(std::fs::remove_file(p), "delete a host's files")?;
                    }
                }
                hosts = [a, open(&paths[1], *next, &model.time, &stream)?];
                both_agree(&hosts, &stream, &model, &never_stored, &format!("after the reopen at step {step}"))?;
                continue;
            }
            _ => {}
        }
        let command = resolve(op, &model, &history);
        let host = if host_bound(&command) { &hosts[0] } else { &hosts[route] };
        caught_up(host, &stream)?;
        let (command, got) = execute(host, command);
        learn_clock(host, &mut model)?;
        let want = model.apply(&command).map_err(Error::Rejected);
        same(&got, &want, format_args!("step {step}: {command:#?}"))?;
        history.record(&command, want.as_ref().ok());
        same(ok(host.tip(), "tip")?.0, model.seq, format_args!("step {step}: log tip"))?;
        if want.is_err() {
            never_stored.extend(carried_content(&command));
        }
    }
    both_agree(&hosts, &stream, &model, &never_stored, "at the end")?;
    for h in hosts {
        ok(h.close(), "close")?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(check::config(CASES_DEFAULT))]

    #[test]
    fn hosts_of_a_shared_log_agree_with_the_model(
        first in policy(),
        ops in sequence(OPS_MAX),
        routes in proptest::collection::vec(any::<bool>(), 1..8),
    ) {
        run(first, &ops, &routes)?;
    }
}
