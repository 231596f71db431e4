//! Command sequences, checkpoints, power losses, crashes and failing I/O calls against an
//! engine on the simulated disk (`annal::fault::disk`), with durable commits. The input
//! is structured (`arbitrary`): a list of steps over a small alphabet of sessions, turn
//! ids, keys and bodies (with an empty and an over-limit choice in each), so that
//! commands meet each other and an input of a few KiB holds hundreds of steps.
//! No reference model is needed for what is checked:
//!
//! - an accepted command that writes moves the tip by the events its receipts name, in
//!   order; a no-op and every rejection leave the tip where it was; nothing but a typed
//!   rejection comes back unless an I/O call failed or the power went;
//! - a command acknowledged through a failed write or fsync is a finding;
//! - after every power loss, crash or failed call the engine is reopened on what the
//!   disk kept, and every acknowledged commit is there: the record at the acknowledged
//!   tip carries the acknowledged chain hash (so every record before it is the same);
//!   past it there is at most the one command that was in flight, whole: if the engine
//!   that lost power had finished it, the tip is the acknowledged one or that engine's,
//!   with its chain hash; otherwise every record past the acknowledged tip was written
//!   by one commit (one commit time);
//! - a clean reopen folds nothing (the close checkpointed everything);
//! - a purge (of a session, with its forks if asked) or a content collection, run after a
//!   clean close on real files that hold the disk's images (it replaces files, which the
//!   simulated disk does not model), adds one tombstone per purged session and nothing
//!   else, and each purged session answers `Purged` at the seq of its tombstone;
//! - after every reopen, and at the end, `annal verify --deep` of the live engine finds
//!   nothing: the log verifies, and the projections as a reader sees them equal a fold of
//!   the whole log from nothing (the engine's own `evolve`, into scratch state);
//! - at the end, if the input asks for a clean close, `annal verify`'s own check of the
//!   closed log file (opened as `annal verify` opens it) is clean and ends at the
//!   acknowledged tip; otherwise the process is killed after the last check.
//!
//! Speed (so that a run tries many inputs): every input starts from a copy of a fresh
//! engine's two files, made once per process, instead of creating two databases; an
//! engine whose process died with the power or was killed is severed from its files
//! (`SimDisk::sever_detached`) and dropped on a thread of its own ([`reap`]). The engine
//! takes its threads from a pool and verifies a short log on the caller's thread, so an
//! input creates no thread. `fuzz/run.sh` builds this target without a sanitizer, without
//! comparison tracing and without debug assertions (overflow checks stay on), and runs
//! it without libFuzzer's entropic schedule (`fuzz/README.md` says why). A purge or
//! collection step costs more than any other: it goes through real files, and a purge
//! rewrites both.

#![no_main]

/// With the `mimalloc` feature (`run.sh`'s build of this target), memory comes from
/// mimalloc: the engine's threads allocate and free across each other, and the system
/// allocator's arena locks and consolidation took a sixth of an execution.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use annal::fault::disk::{IoKind, SimDisk};
use annal::{
    AcquireLease, AppendContext, AppendDraft, ClaimInputs, ClaimTarget, Command, CommitTurn, CreateSession, Durability,
    Engine, EnqueueInput, Error, EventQuery, Expected, Fence, Fork, InputKind, Limits, ManualClock, Message, Options,
    Outcome, PageRequest, RecordToolCall, RecordToolResult, Recovery, RenewLease, Restore, RevisionId, Rewrite,
    RewriteReason, Role, SessionId, SetHostState, SetLabels, SetMetadata, StateChanges, ToolOutcome, Usage,
};
use annal_codec::ChainHash;
use annal_replay::verify::{verify_log, verify_snapshot, VerifyOptions};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// Sessions the commands address.
const SESSIONS: u8 = 4;
/// Steps per input at most.
const STEPS_MAX: usize = 512;
/// Members of a batch at most.
const BATCH_MAX: usize = 6;
/// Opens in a row that an armed fault or power loss may interrupt.
const FAULTED_OPENS_MAX: u32 = 2;

const LOG: &str = "log";
const PROJECTIONS: &str = "projections";
const JOURNAL: [&str; 2] = ["journal.0", "journal.1"];

fn limits() -> Limits {
    Limits {
        content_bytes_max: 64,
        command_bytes_max: 512,
        messages_per_command_max: 3,
        labels_per_session_max: 3,
        label_key_bytes_max: 8,
        label_value_bytes_max: 8,
        id_bytes_max: 16,
        page_items_max: 64,
        page_bytes_max: 1 << 16,
        record_bytes_max: 1 << 14,
        metadata_bytes_max: 8,
        batch_commands_max: BATCH_MAX as u64,
        attachments_per_message_max: 1,
        list_items_max: 3,
        note_bytes_max: 16,
        host_state_name_bytes_max: 8,
        host_state_entries_max: 3,
        draft_bytes_max: 16,
        session_draft_bytes_max: 24,
        draft_bytes_total_max: 40,
        inbox_inputs_max: 3,
    }
}

/// A choice from a small alphabet: the last one or two are empty or over a limit.
fn word(i: u8, alphabet: &[&str]) -> String {
    alphabet[i as usize % alphabet.len()].to_string()
}

const INPUTS: [&str; 4] = ["i1", "i2", "i3", ""];
const DRAFTS: [&str; 3] = ["d1", "d2", ""];
const SEGMENTS: [&str; 4] = ["ab", "cde", "", "a-segment-longer-than-the-draft-limit"];
const TURNS: [&str; 6] = ["t0", "t1", "t2", "t3", "", "turn-id-too-long-x"];
const KEYS: [&str; 4] = ["k0", "k1", "k2", ""];
const OPS: [&str; 5] = ["o0", "o1", "o2", "o9", ""];
const BODIES: [&str; 7] = ["hi", "ok", "yes", "", "a", "a longer body that compresses compresses compresses", "zz"];
const LABEL_KEYS: [&str; 4] = ["a", "b", "c", "keytoolong"];
const LABEL_VALUES: [&str; 3] = ["1", "2", ""];
const STATE_NAMES: [&str; 5] = ["model", "tool", "plugin", "", "name-over-8"];

/// Host state changes: at most one entry set and one removed.
fn state(set: &Option<(u8, u8)>, remove: &Option<u8>) -> StateChanges {
    StateChanges {
        set: set.iter().map(|(n, v)| (word(*n, &STATE_NAMES), body(*v))).collect(),
        remove: remove.iter().map(|n| word(*n, &STATE_NAMES)).collect(),
    }
}

fn sid(s: u8) -> SessionId {
    let mut bytes = [0x5e; 16];
    bytes[15] = s % (SESSIONS + 1);
    SessionId(bytes)
}

fn body(i: u8) -> Vec<u8> {
    match i {
        250.. => vec![b'x'; 65],
        _ => word(i, &BODIES).into_bytes(),
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Msg {
    role: u8,
    body: u8,
}

fn message(m: &Msg) -> Message {
    Message::new(
        [Role::System, Role::User, Role::Assistant, Role::Tool][m.role as usize % 4],
        "text/plain",
        body(m.body),
    )
}

fn messages(ms: &[Msg]) -> Vec<Message> {
    ms.iter().map(message).collect()
}

/// A list of at most `N` items whose length is one byte of the input. A `Vec` inside a
/// step would take its length as a share of all the bytes left, so one message list
/// could swallow every step after it; with this, a step costs what its fields do, and an
/// input of a few KiB holds hundreds of steps.
#[derive(Debug, Clone)]
struct Few<T, const N: usize>(Vec<T>);

impl<'a, T: Arbitrary<'a>, const N: usize> Arbitrary<'a> for Few<T, N> {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        let len = usize::from(u8::arbitrary(u)?) % (N + 1);
        (0..len).map(|_| T::arbitrary(u)).collect::<arbitrary::Result<_>>().map(Few)
    }
}

/// Which revision a command names.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Rev {
    Head,
    Any,
    /// One of the session's revisions, by index into its revision list.
    Past(u8),
    Unknown,
    /// `Expected::Version`: the session's stream seq, plus this offset (wrapping).
    Version(i8),
}

#[derive(Arbitrary, Debug, Clone)]
enum Step {
    Create {
        s: u8,
        messages: Few<Msg, 4>,
        label: Option<(u8, u8)>,
    },
    Turn {
        s: u8,
        turn: u8,
        expected: Rev,
        messages: Few<Msg, 4>,
        usage: Option<(u8, u8)>,
        context: Option<u8>,
        tool: Option<u8>,
        set_state: Option<(u8, u8)>,
        remove_state: Option<u8>,
        finalize: Option<u8>,
        consume: Option<u8>,
    },
    /// Queue an input.
    Enqueue {
        s: u8,
        id: u8,
        message: Msg,
        active: bool,
    },
    /// Claim inputs with the current lease token moved by `off`.
    Claim {
        s: u8,
        off: i8,
        turn: Option<u8>,
        ttl: u8,
        max: u8,
    },
    /// Abandon claim `claim` (a stream seq).
    Abandon {
        s: u8,
        claim: u8,
    },
    /// Cancel an input.
    Cancel {
        s: u8,
        id: u8,
    },
    /// Append a segment to a draft.
    Draft {
        s: u8,
        id: u8,
        segment: u8,
    },
    /// Discard a draft.
    Discard {
        s: u8,
        id: u8,
    },
    Rewrite {
        s: u8,
        expected: Rev,
        start: u8,
        len: u8,
        replacement: Few<Msg, 4>,
        reason: u8,
    },
    Restore {
        s: u8,
        expected: Rev,
        target: Rev,
    },
    Fork {
        parent: u8,
        child: u8,
        index: u8,
        replacement: Option<Msg>,
    },
    Archive {
        s: u8,
    },
    Revive {
        s: u8,
    },
    Context {
        s: u8,
        key: u8,
        content: u8,
    },
    ToolCall {
        s: u8,
        op: u8,
        parent: Option<u8>,
        args: u8,
        safe: bool,
    },
    ToolResult {
        s: u8,
        op: u8,
        outcome: u8,
        result: u8,
    },
    Labels {
        s: u8,
        set: Option<(u8, u8)>,
        remove: Option<u8>,
    },
    Metadata {
        s: u8,
        metadata: u8,
        expected: Rev,
    },
    HostState {
        s: u8,
        set: Option<(u8, u8)>,
        remove: Option<u8>,
        expected: Rev,
    },
    Batch(Few<Step, { BATCH_MAX + 1 }>),
    /// Take (or renew) the lease of `s`.
    Lease {
        s: u8,
        owner: u8,
        ttl: u8,
    },
    /// Renew the lease of `s` with its current token moved by `off`.
    Renew {
        s: u8,
        off: i8,
        ttl: u8,
    },
    /// Release the lease of `s` with its current token moved by `off`.
    Release {
        s: u8,
        off: i8,
    },
    /// `step`, fenced on `s` with its current token moved by `off`.
    Fenced {
        s: u8,
        off: i8,
        step: Box<Step>,
    },
    /// Move the writer's clock forward.
    Tick(u16),
    /// Not a command: a checkpoint, a power loss, a crash, a failing call.
    Disk(Disk),
}

/// What happens to the engine or its disk between commands (one step kind of the
/// thirteen, so that most steps are commands).
#[derive(Arbitrary, Debug, Clone)]
enum Disk {
    /// `Engine::checkpoint`.
    Checkpoint,
    /// Cut the power now, reopen, check.
    PowerLoss,
    /// Kill the process now (every write survives), reopen, check.
    Kill,
    /// Close, reopen, check.
    Reopen,
    /// The I/O call `n` calls from now fails.
    Fault(u8),
    /// The power goes just before the I/O call `n` calls from now.
    PowerLossAt(u8),
    /// Close, purge session `s` (with its fork descendants if asked), reopen, check.
    Purge { s: u8, descendants: bool },
    /// Close, collect unreachable content, reopen, check.
    Gc,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Seeds the disk's choices: which unsynced writes survive, where they tear.
    disk_seed: u64,
    multi_process_readers: bool,
    /// How content is stored: lz4, zstd or raw, by this modulo 3.
    compression: u8,
    /// Whether the run ends with a clean close and `annal verify` of the closed log file,
    /// or with the process killed after the last check of the live engine. A close costs
    /// two redb closing commits, the largest cost of a short input.
    close: bool,
    steps: Steps,
}

/// The steps: as many as the rest of the input holds, up to [`STEPS_MAX`]. A derived
/// `Vec` puts a go-on-or-stop byte before each element, so a mutation of any of those
/// bytes ends the list there, and inputs would rarely get past a few tens of steps.
#[derive(Debug)]
struct Steps(Vec<Step>);

impl<'a> Arbitrary<'a> for Steps {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        let mut steps = Vec::new();
        while !u.is_empty() && steps.len() < STEPS_MAX {
            steps.push(Step::arbitrary(u)?);
        }
        Ok(Steps(steps))
    }

    fn arbitrary_take_rest(mut u: arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Self::arbitrary(&mut u)
    }
}

/// What the engine has acknowledged: the tip, and its chain hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Acked {
    seq: u64,
    hash: ChainHash,
}

/// Acknowledged draft segments: (session, draft id) → segments.
type Drafts = std::collections::BTreeMap<(SessionId, String), Vec<Vec<u8>>>;

struct Run {
    disk: SimDisk,
    clock: ManualClock,
    /// What the acknowledged draft commands left.
    drafts: Drafts,
    /// The command running when the power went or a call failed.
    in_flight: Option<Command>,
    options: Options,
    engine: Option<Engine>,
    acked: Acked,
    /// Whether this input already ran its purge or collection (at most one each input:
    /// each works on real files, closing and reopening engines, and costs as much as
    /// hundreds of commands; the later ones are skipped).
    purged: bool,
}

/// The compressions a run may store its content with.
const COMPRESSIONS: [annal::Compression; 3] =
    [annal::Compression::Lz4, annal::Compression::Zstd, annal::Compression::Off];

/// The two files of a fresh engine in the mode of `options` (created on an unfaulted
/// simulated disk, its projections caught up, closed), made once per process for each
/// mode. Creating two databases costs more than a typical input's commands, and it is the
/// same for every input (one clock, nothing armed, no choice of the disk's), so every input
/// starts from a copy of these files instead; what the run checks begins at their open.
fn fresh(options: &Options) -> (Vec<u8>, Vec<u8>) {
    static FRESH: [OnceLock<(Vec<u8>, Vec<u8>)>; 6] = [const { OnceLock::new() }; 6];
    let compression = COMPRESSIONS.iter().position(|c| *c == options.compression).expect("one of them");
    let mode = usize::from(options.multi_process_readers) * 3 + compression;
    let files = FRESH[mode].get_or_init(|| {
        let disk = SimDisk::new(0);
        let journal = [disk.file(JOURNAL[0]), disk.file(JOURNAL[1])];
        let engine = Engine::open_with_journal(disk.file(LOG), disk.file(PROJECTIONS), journal, options.clone())
            .expect("a fresh engine opens");
        assert_eq!(engine.tip().expect("tip").0, 0, "a fresh engine is empty");
        engine.close().expect("a fresh engine closes");
        (disk.image(LOG).expect("the log file"), disk.image(PROJECTIONS).expect("the projections file"))
    });
    files.clone()
}

/// Drops an engine whose process is gone on a thread of its own. Its files are severed,
/// so nothing it does reaches the disk or counts as one of the disk's I/O calls, and
/// nothing the input checks waits for it; its drop still runs redb's closing commits,
/// which compute the allocator state before their first write fails (about 470 µs an
/// engine). At most four wait; past that the caller drops it.
fn reap(engine: Engine) {
    static REAPER: OnceLock<std::sync::mpsc::SyncSender<Engine>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Engine>(4);
        std::thread::spawn(move || rx.into_iter().for_each(drop));
        tx
    });
    if let Err(std::sync::mpsc::TrySendError::Full(engine) | std::sync::mpsc::TrySendError::Disconnected(engine)) =
        reaper.try_send(engine)
    {
        drop(engine);
    }
}

/// A directory for a purge step's real files, in memory where the system has such a
/// place (`/dev/shm`). The files stand for the simulated disk's images for one call and
/// nothing needs them durable, but a purge or collection syncs them about fifteen times,
/// and on a disk each sync waits for the device (replaying 967 kept inputs, with 4,820
/// such steps, took 21.5 s with the files on the disk and 12.1 s in `/dev/shm`).
fn scratch_dir() -> tempfile::TempDir {
    static ROOT: OnceLock<std::path::PathBuf> = OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        if tempfile::tempdir_in(shm).is_ok() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        }
    });
    tempfile::tempdir_in(root).expect("a temporary directory")
}

fn events(engine: &Engine, from: u64) -> Vec<annal::StoredEvent> {
    let mut out = Vec::new();
    let mut from = from;
    loop {
        let q = EventQuery { from_seq: from, max_events: 64, max_bytes: 1 << 16 };
        let page = engine.events(q).expect("the log reads and its chain verifies");
        out.extend(page.events);
        if !page.has_more {
            return out;
        }
        from = page.next_seq;
    }
}

impl Run {
    fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("open")
    }

    fn head(&self, s: SessionId) -> Option<RevisionId> {
        self.engine().head(s).ok().flatten().map(|h| h.revision)
    }

    fn revision(&self, s: SessionId, r: Rev) -> RevisionId {
        match r {
            Rev::Head | Rev::Any | Rev::Version(_) => self.head(s).unwrap_or_else(RevisionId::empty),
            Rev::Past(i) => match self.engine().revisions(s, PageRequest::first(64)) {
                Ok(page) if !page.page.items.is_empty() => page.page.items[i as usize % page.page.items.len()].revision,
                _ => RevisionId::empty(),
            },
            Rev::Unknown => RevisionId([0xee; 32]),
        }
    }

    fn expected(&self, s: SessionId, r: Rev) -> Expected {
        match r {
            Rev::Any => Expected::Any,
            Rev::Version(off) => {
                let at = self.engine().head(s).ok().flatten().map_or(0, |h| h.stream_seq);
                Expected::Version(at.wrapping_add_signed(i64::from(off)))
            }
            r => Expected::Exact(self.revision(s, r)),
        }
    }

    /// The current lease token of `s` moved by `off` (the head as the engine shows it).
    fn token(&self, s: SessionId, off: i8) -> u64 {
        let current = self.engine().head(s).ok().flatten().and_then(|h| h.lease).map_or(0, |l| l.token);
        current.wrapping_add_signed(i64::from(off))
    }

    fn command(&self, step: &Step, depth: u32) -> Option<Command> {
        Some(match step {
            Step::Lease { s, owner, ttl } => Command::AcquireLease(AcquireLease {
                session: sid(*s),
                owner: ["w1", "w2", ""][*owner as usize % 3].into(),
                ttl_ms: u64::from(*ttl) * 10,
            }),
            Step::Renew { s, off, ttl } => Command::RenewLease(RenewLease {
                session: sid(*s),
                token: self.token(sid(*s), *off),
                ttl_ms: u64::from(*ttl) * 10,
            }),
            Step::Release { s, off } => Command::ReleaseLease { session: sid(*s), token: self.token(sid(*s), *off) },
            Step::Fenced { s, off, step } => Command::Fenced {
                fence: Fence { session: sid(*s), token: self.token(sid(*s), *off) },
                command: Box::new(self.command(step, depth)?),
            },
            Step::Create { s, messages: ms, label } => Command::CreateSession(CreateSession {
                session: sid(*s),
                labels: label.iter().map(|(k, v)| (word(*k, &LABEL_KEYS), word(*v, &LABEL_VALUES))).collect(),
                metadata: Vec::new(),
                messages: messages(&ms.0),
            }),
            Step::Draft { s, id, segment } => Command::AppendDraft(AppendDraft {
                session: sid(*s),
                draft_id: word(*id, &DRAFTS),
                segment: word(*segment, &SEGMENTS).into_bytes(),
            }),
            Step::Discard { s, id } => Command::DiscardDraft { session: sid(*s), draft_id: word(*id, &DRAFTS) },
            Step::Enqueue { s, id, message, active } => Command::EnqueueInput(EnqueueInput {
                session: sid(*s),
                input_id: word(*id, &INPUTS),
                message: messages(std::slice::from_ref(message)).remove(0),
                kind: if *active { InputKind::ActiveTurn } else { InputKind::NextTurn },
            }),
            Step::Claim { s, off, turn, ttl, max } => Command::ClaimInputs(ClaimInputs {
                session: sid(*s),
                token: self.token(sid(*s), *off),
                owner: "w1".into(),
                target: match turn {
                    Some(t) => ClaimTarget::Turn(word(*t, &TURNS)),
                    None => ClaimTarget::NextTurn,
                },
                ttl_ms: u64::from(*ttl) * 10,
                max: u64::from(*max % 4),
            }),
            Step::Abandon { s, claim } => Command::AbandonClaim { session: sid(*s), claim: u64::from(*claim) },
            Step::Cancel { s, id } => Command::CancelInput { session: sid(*s), input_id: word(*id, &INPUTS) },
            Step::Turn {
                s,
                turn,
                expected,
                messages: ms,
                usage,
                context,
                tool,
                set_state,
                remove_state,
                finalize,
                consume,
            } => {
                let s = sid(*s);
                Command::CommitTurn(CommitTurn {
                    session: s,
                    turn_id: word(*turn, &TURNS),
                    expected: self.expected(s, *expected),
                    messages: messages(&ms.0),
                    usage: usage
                        .iter()
                        .map(|(i, o)| Usage {
                            provider: "p".into(),
                            model: "m".into(),
                            input: u64::from(*i),
                            output: u64::from(*o),
                            cache_read: 0,
                            cache_write: 0,
                        })
                        .collect(),
                    applied_context: context.iter().map(|k| word(*k, &KEYS)).collect(),
                    tool_ops: tool.iter().map(|o| word(*o, &OPS)).collect(),
                    run_id: None,
                    state: state(set_state, remove_state),
                    draft: finalize.map(|d| word(d, &DRAFTS)),
                    inputs: consume.iter().map(|i| word(*i, &INPUTS)).collect(),
                })
            }
            Step::Rewrite { s, expected, start, len, replacement, reason } => {
                let s = sid(*s);
                let start = u64::from(*start % 8);
                Command::Rewrite(Rewrite {
                    session: s,
                    expected: self.revision(s, *expected),
                    start,
                    end: start + u64::from(*len % 4),
                    replacement: messages(&replacement.0),
                    reason: [RewriteReason::Edit, RewriteReason::Compaction, RewriteReason::Redaction]
                        [*reason as usize % 3],
                    note: "n".into(),
                    actor: "fuzz".into(),
                })
            }
            Step::Restore { s, expected, target } => {
                let s = sid(*s);
                Command::Restore(Restore {
                    session: s,
                    expected: self.revision(s, *expected),
                    target: self.revision(s, *target),
                    note: String::new(),
                    actor: "fuzz".into(),
                })
            }
            Step::Fork { parent, child, index, replacement } => Command::Fork(Fork {
                parent: sid(*parent),
                session: sid(*child),
                index: u64::from(*index % 8),
                replacement: replacement.as_ref().map(message),
                labels: None,
            }),
            Step::Archive { s } => Command::Archive { session: sid(*s), reason: "done".into() },
            Step::Revive { s } => Command::Revive { session: sid(*s), reason: "again".into() },
            Step::Context { s, key, content } => Command::AppendContext(AppendContext {
                session: sid(*s),
                key: word(*key, &KEYS),
                content: body(*content),
                source: "fuzz".into(),
            }),
            Step::ToolCall { s, op, parent, args, safe } => Command::RecordToolCall(RecordToolCall {
                session: sid(*s),
                op_id: word(*op, &OPS),
                call_id: "c".into(),
                tool_name: "ls".into(),
                args: body(*args),
                parent_op: parent.map(|p| word(p, &OPS)),
                turn_id: None,
                recovery: if *safe { Recovery::ReplaySafe } else { Recovery::NotReplaySafe },
            }),
            Step::ToolResult { s, op, outcome, result } => Command::RecordToolResult(RecordToolResult {
                session: sid(*s),
                op_id: word(*op, &OPS),
                outcome: [ToolOutcome::Ok, ToolOutcome::Error, ToolOutcome::Cancelled][*outcome as usize % 3],
                result: body(*result),
            }),
            Step::Labels { s, set, remove } => Command::SetLabels(SetLabels {
                session: sid(*s),
                set: set.iter().map(|(k, v)| (word(*k, &LABEL_KEYS), word(*v, &LABEL_VALUES))).collect(),
                remove: remove.iter().map(|k| word(*k, &LABEL_KEYS)).collect(),
            }),
            Step::Metadata { s, metadata, expected } => {
                let s = sid(*s);
                Command::SetMetadata(SetMetadata {
                    session: s,
                    metadata: body(*metadata),
                    expected: self.expected(s, *expected),
                })
            }
            Step::HostState { s, set, remove, expected } => {
                let s = sid(*s);
                Command::SetHostState(SetHostState {
                    session: s,
                    state: state(set, remove),
                    expected: self.expected(s, *expected),
                })
            }
            Step::Batch(members) if depth == 0 => {
                Command::Batch(members.0.iter().filter_map(|m| self.command(m, 1)).collect())
            }
            _ => return None,
        })
    }

    /// Opens the engine on the disk; an open that an armed fault or power loss
    /// interrupts is retried after a power loss.
    fn open(&mut self, mut faulted: u32) {
        loop {
            let journal = [self.disk.file(JOURNAL[0]), self.disk.file(JOURNAL[1])];
            let opened = Engine::open_with_journal(
                self.disk.file(LOG),
                self.disk.file(PROJECTIONS),
                journal,
                self.options.clone(),
            );
            let fired = self.disk.take_fired().is_some();
            let lost = self.disk.take_power_loss().is_some();
            let interrupted = fired || lost;
            self.disk.disarm();
            match opened {
                Ok(engine) if !interrupted => {
                    self.engine = Some(engine);
                    return;
                }
                // Every file the engine opens here opened before (the run starts from a
                // fresh engine's closed files), and redb commits are atomic: an open with
                // no fault must succeed.
                Err(e) if !interrupted => panic!("an open failed with no fault: {e:?}"),
                opened => {
                    // What a failed call left on the disk is unknown: the power goes
                    // (if it has not), then the engine.
                    if !lost {
                        self.disk.lose_power();
                    }
                    // Its process is gone with the power: nothing it does from here on
                    // (its close included) reaches anything.
                    self.disk.sever_detached();
                    if let Ok(engine) = opened {
                        reap(engine);
                    }
                    faulted += 1;
                    if faulted > FAULTED_OPENS_MAX {
                        self.disk.disarm();
                    }
                }
            }
        }
    }

    /// After a power loss, a crash or a failed call: checks what the reopened engine
    /// holds against what was acknowledged and what was in flight.
    fn check_reopened(&mut self, in_flight: Option<InFlight>) {
        let engine = self.engine();
        let (tip, hash) = engine.tip().expect("tip");
        assert!(tip >= self.acked.seq, "acknowledged commits were lost: tip {tip}, acknowledged {:?}", self.acked);
        if self.acked.seq > 0 {
            let q = EventQuery { from_seq: self.acked.seq, max_events: 1, max_bytes: 1 << 16 };
            let at = engine.events(q).expect("the acknowledged tip's record reads");
            assert_eq!(at.events[0].chain_hash, self.acked.hash, "the acknowledged tip's record changed");
        }
        match in_flight {
            _ if tip == self.acked.seq => {}
            None => panic!("tip {tip} past the acknowledged {:?} with nothing in flight", self.acked),
            Some(InFlight::Finished(ghost)) => {
                assert_eq!((tip, hash), (ghost.seq, ghost.hash), "the command in flight is there, but not whole");
            }
            Some(InFlight::Failed) => {
                let past = events(engine, self.acked.seq + 1);
                let times: std::collections::BTreeSet<u64> = past.iter().map(|e| e.record.committed_at_ms).collect();
                assert_eq!(times.len(), 1, "the records past the acknowledged tip come from one commit");
            }
        }
        self.acked = Acked { seq: tip, hash };
        self.check_drafts();
        self.check_projections();
    }

    /// Drafts reach the file within the flush interval: each draft the reopened engine
    /// holds is a prefix of what was acknowledged (or appended by the command in
    /// flight), and no other draft is there. What survived is what counts from now on.
    fn check_drafts(&mut self) {
        let mut allowed = self.drafts.clone();
        if let Some(Command::AppendDraft(c)) = self.in_flight.take().as_ref().map(Command::unfenced) {
            allowed.entry((c.session, c.draft_id.clone())).or_default().push(c.segment.clone());
        }
        let mut survived = Drafts::new();
        for s in 0..=SESSIONS {
            for d in self.engine().drafts(sid(s), u64::MAX) {
                let key = (sid(s), d.draft_id.clone());
                let appended = allowed.get(&key).unwrap_or_else(|| panic!("draft {key:?} was never appended"));
                assert!(
                    d.segments.len() <= appended.len() && d.segments[..] == appended[..d.segments.len()],
                    "draft {key:?} is not a prefix of what was appended"
                );
                survived.insert(key, d.segments);
            }
        }
        self.drafts = survived;
    }

    /// The projections as a reader sees them (the checkpoint, what the open folded, the
    /// delta) equal a fresh fold of the log, and the log itself is sound: `annal verify
    /// --deep` on the live engine's snapshot (the engine's own `evolve` into scratch
    /// state, compared table by table) finds nothing.
    fn check_projections(&self) {
        let engine = self.engine();
        let view = engine.reader().snapshot().expect("snapshot");
        let opts = VerifyOptions { deep: true, ..VerifyOptions::default() };
        let stored = || engine.reader().snapshot();
        let journal = JOURNAL.map(|name| self.disk.image(name).unwrap_or_default());
        let report = verify_log(view.log(), &journal, &limits(), &opts, &stored).expect("verify runs");
        assert!(report.is_clean(), "verify --deep of the live engine: {:?}", report.findings);
        assert!(matches!(report.deep, Some(Ok(n)) if n > 0), "the projections were compared: {:?}", report.deep);
        assert_eq!(report.records, view.seq(), "verify walked every record");
    }

    fn reopen(&mut self, down: Down, in_flight: Option<InFlight>) {
        self.disk.disarm();
        let engine = self.engine.take().expect("open");
        if down == Down::Clean {
            engine.close().expect("close");
        } else {
            match down {
                Down::Kill => self.disk.kill(),
                Down::PowerLoss => drop(self.disk.lose_power()),
                Down::Clean | Down::Gone => {}
            }
            // The process died with the power or was killed: what its engine does from
            // here on (its close included) reaches nothing, and fails at its first call.
            self.disk.sever_detached();
            reap(engine);
        }
        self.open(0);
        if down == Down::Clean {
            assert_eq!(self.engine().stats().recovered_events, 0, "close checkpointed the whole delta");
        }
        self.check_reopened(in_flight);
    }

    /// Closes the engine, purges a session (or collects content) on real files that hold
    /// the disk's images (a purge rewrites and replaces files, which the simulated disk
    /// does not model), puts the files back on the disk, reopens and checks: the
    /// tombstones are the only new records, each purged session answers `Purged`, and
    /// `verify --deep` of the live engine finds nothing (`check_projections`).
    fn purge(&mut self, target: Option<(SessionId, bool)>) {
        if std::mem::replace(&mut self.purged, true) {
            return;
        }
        self.disk.disarm();
        self.engine.take().expect("open").close().expect("close");
        self.disk.forget_detached();
        let dir = scratch_dir();
        let path = dir.path().join("db.redb");
        let projections = annal::projections_path(&path);
        std::fs::write(&path, self.disk.image(LOG).unwrap_or_default()).expect("write the log");
        std::fs::write(&projections, self.disk.image(PROJECTIONS).unwrap_or_default()).expect("write projections");
        let options = self.options.clone();
        let result = match target {
            Some((session, descendants)) => {
                let mut request = annal::PurgeRequest::new(session, "fuzz", "fuzz");
                request.descendants = descendants;
                annal::purge(&path, options, &request)
            }
            None => annal::collect_garbage(&path, options),
        };
        let purged = match result {
            Ok(report) => report.purged,
            Err(Error::Rejected(_)) => Vec::new(),
            Err(e) => panic!("a purge failed with no fault: {e:?}"),
        };
        self.disk.set_image(LOG, std::fs::read(&path).expect("read the log"));
        self.disk.set_image(PROJECTIONS, std::fs::read(&projections).expect("read projections"));
        self.open(0);
        let (tip, hash) = self.engine().tip().expect("tip");
        assert_eq!(tip, self.acked.seq + purged.len() as u64, "a purge writes one tombstone per session");
        for (session, seq) in purged {
            match self.engine().head(session) {
                Err(Error::Rejected(annal::Rejection::Purged { seq: at, .. })) => assert_eq!(at, seq),
                other => panic!("a purged session answers {other:?}"),
            }
        }
        self.acked = Acked { seq: tip, hash };
        self.check_projections();
    }

    /// Whether a fault fired or the power went, and how the engine must go down then.
    fn interrupted(&self) -> Option<(Down, Option<annal::fault::disk::Fired>)> {
        let fired = self.disk.take_fired();
        let lost = self.disk.take_power_loss();
        match (fired, lost) {
            (fired, Some(_)) => Some((Down::Gone, fired)),
            (Some(f), None) => Some((Down::PowerLoss, Some(f))),
            (None, None) => None,
        }
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Disk(Disk::Checkpoint) => {
                let result = self.engine().checkpoint();
                match self.interrupted() {
                    Some((down, _)) => self.reopen(down, None),
                    None => result.expect("checkpoint"),
                }
            }
            Step::Disk(Disk::PowerLoss) => self.reopen(Down::PowerLoss, None),
            Step::Disk(Disk::Kill) => self.reopen(Down::Kill, None),
            Step::Disk(Disk::Reopen) => self.reopen(Down::Clean, None),
            Step::Disk(Disk::Fault(n)) => self.disk.fail_call(u64::from(*n)),
            Step::Disk(Disk::PowerLossAt(n)) => self.disk.lose_power_at_call(u64::from(*n)),
            Step::Tick(ms) => self.clock.advance(u64::from(*ms)),
            Step::Disk(Disk::Purge { s, descendants }) => self.purge(Some((sid(*s), *descendants))),
            Step::Disk(Disk::Gc) => self.purge(None),
            step => {
                let Some(command) = self.command(step, 0) else { return };
                self.in_flight = Some(command.clone());
                let got = self.engine().execute(command.clone());
                let interrupted = self.interrupted();
                // The tip as this engine sees it (after a power loss, on its detached files).
                let (tip, hash) = match self.engine().tip() {
                    Ok(tip) => tip,
                    Err(e) if interrupted.is_some() => {
                        drop(e);
                        (self.acked.seq, self.acked.hash)
                    }
                    Err(e) => panic!("tip: {e:?}"),
                };
                match (interrupted, got) {
                    (None, Ok(outcome)) => {
                        let named = outcome.seqs();
                        let expected: Vec<u64> = (self.acked.seq + 1..=tip).collect();
                        assert_eq!(named, expected, "receipts name the events written, in order: {outcome:?}");
                        assert_eq!(outcome.wrote(), tip > self.acked.seq, "{outcome:?}");
                        self.acked = Acked { seq: tip, hash };
                        track_drafts(&mut self.drafts, &command, &outcome);
                        self.in_flight = None;
                    }
                    (None, Err(Error::Rejected(_))) => {
                        assert_eq!(tip, self.acked.seq, "a rejection writes nothing");
                        self.in_flight = None;
                    }
                    (None, Err(e)) => panic!("a command failed with no fault: {e:?}"),
                    (Some((down, fired)), got) => {
                        if let (Some(f), Down::PowerLoss) = (&fired, down) {
                            let through = matches!(f.kind, IoKind::Write | IoKind::Sync);
                            assert!(
                                !(through && got.as_ref().is_ok_and(Outcome::wrote)),
                                "a command was acknowledged through a failed {:?}: {got:?}",
                                f.kind
                            );
                        }
                        // An engine whose power went finished the command on its own.
                        let in_flight = match (&got, down) {
                            (Ok(_), Down::Gone) => InFlight::Finished(Acked { seq: tip, hash }),
                            _ => InFlight::Failed,
                        };
                        self.reopen(down, Some(in_flight));
                    }
                }
            }
        }
    }

    /// The final checks: the projections equal a fresh fold; then, if `close`, after a
    /// clean close `annal verify`'s check of the log file (opened as `annal verify` opens
    /// it) is clean and ends at the acknowledged tip, or else the process is killed.
    fn finish(mut self, close: bool) {
        self.disk.disarm();
        self.check_projections();
        let engine = self.engine.take().expect("open");
        if !close {
            // The process ends here, killed: what it wrote stays, and nothing is checked
            // after it (`Disk::Kill` and `Disk::Reopen` check the reopen).
            self.disk.kill();
            self.disk.sever_detached();
            reap(engine);
            return;
        }
        engine.close().expect("close");
        let mut builder = redb::Builder::new();
        builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
        builder.set_cache_size(annal::reader::READER_CACHE_BYTES);
        // Read-only: nothing to commit when it is dropped.
        let db = builder.open_read_only_with_backend(self.disk.file(LOG)).expect("the log opens");
        let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
        let opts =
            VerifyOptions { expect_tip: (self.acked.seq > 0).then_some(self.acked.hash), ..VerifyOptions::default() };
        let stored = || -> annal::Result<annal::View> { unreachable!("not deep") };
        let report = verify_snapshot(&txn, &limits(), &opts, &stored).expect("verify runs");
        assert!(report.is_clean(), "verify: {:?}", report.findings);
        assert_eq!(report.records, self.acked.seq, "verify walked every record");
    }
}

/// Follows what an acknowledged command did to the drafts.
fn track_drafts(drafts: &mut Drafts, command: &Command, outcome: &Outcome) {
    match (command, outcome) {
        (Command::Fenced { command, .. }, outcome) => track_drafts(drafts, command, outcome),
        (Command::Batch(members), Outcome::Batch(outcomes)) => {
            members.iter().zip(outcomes).for_each(|(c, o)| track_drafts(drafts, c, o))
        }
        (Command::AppendDraft(c), Outcome::DraftAppended { index, .. }) => {
            let d = drafts.entry((c.session, c.draft_id.clone())).or_default();
            assert_eq!(*index as usize, d.len(), "a draft segment's index");
            d.push(c.segment.clone());
        }
        (Command::DiscardDraft { session, draft_id }, Outcome::DraftDiscarded { existed }) => {
            assert_eq!(drafts.remove(&(*session, draft_id.clone())).is_some(), *existed, "whether a draft existed");
        }
        (Command::CommitTurn(CommitTurn { session, draft: Some(id), .. }), _) => {
            drafts.remove(&(*session, id.clone()));
        }
        _ => {}
    }
}

/// The command that was running when the power went or a call failed.
enum InFlight {
    /// The engine (on its detached files) finished it: its tip and chain hash then.
    Finished(Acked),
    /// It failed, or its outcome is unknown.
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Down {
    Clean,
    Kill,
    PowerLoss,
    Gone,
}

fuzz_target!(|input: Input| {
    let clock = ManualClock::new(1_767_225_600_000);
    let options = Options {
        clock: std::sync::Arc::new(clock.clone()),
        limits: limits(),
        durability: Durability::Durable,
        multi_process_readers: input.multi_process_readers,
        compression: COMPRESSIONS[usize::from(input.compression % 3)],
        cache_bytes: 1 << 20,
        queue_depth: 4,
        // A little preallocation: frames land in place, and past it the files grow.
        journal_preallocate_bytes: 4096,
        checkpoint: annal::CheckpointPolicy {
            events: u64::MAX,
            delta_bytes: u64::MAX,
            interval: std::time::Duration::from_secs(3600),
            delta_bytes_max: u64::MAX,
        },
        ..Options::default()
    };
    let mut run = Run {
        disk: SimDisk::new(input.disk_seed),
        clock,
        drafts: Drafts::new(),
        in_flight: None,
        options,
        engine: None,
        acked: Acked { seq: 0, hash: annal_codec::LogChain::plain().genesis() },
        purged: false,
    };
    let (log, projections) = fresh(&run.options);
    run.disk.set_image(LOG, log);
    run.disk.set_image(PROJECTIONS, projections);
    run.open(FAULTED_OPENS_MAX);
    for step in &input.steps.0 {
        run.step(step);
    }
    run.finish(input.close);
});
