//! Abstract operations over a small universe, and how each becomes a concrete
//! [`Command`] against the model's current state.
//!
//! The universe is small on purpose so that sequences collide: five session ids (most
//! creates and forks name one of them, so `AlreadyExists` comes up; the rest take a
//! fresh UUIDv7 id, and forks to a fresh id go through `fork_at` and `fork_replace`),
//! four turn ids (so retries and `TurnConflict` come up), three context keys, three
//! tool op ids, a handful of tiny message bodies (so revisions repeat and content is
//! shared), and now and then an empty or over-limit id, body, note or label.
//!
//! Besides commands, a sequence holds comparisons, checkpoints and reopens; a reopen
//! names the checkpoint policy of the next open and what happens to the projections
//! file while the engine is closed.

use super::reference::Model;
use annal::*;
use proptest::collection::vec;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// Sessions in the universe.
pub const SESSIONS: u8 = 5;

/// The limits every run uses: small enough that the generators cross each of them.
pub fn limits() -> Limits {
    Limits {
        content_bytes_max: 64,
        command_bytes_max: 200,
        messages_per_command_max: 3,
        labels_per_session_max: 3,
        label_key_bytes_max: 6,
        label_value_bytes_max: 6,
        id_bytes_max: 16,
        page_items_max: 100,
        page_bytes_max: 1 << 20,
        metadata_bytes_max: 8,
        batch_commands_max: 4,
        attachments_per_message_max: 1,
        list_items_max: 3,
        note_bytes_max: 12,
        host_state_name_bytes_max: 16,
        host_state_entries_max: 3,
        draft_bytes_max: 8,
        session_draft_bytes_max: 12,
        draft_bytes_total_max: 20,
        inbox_inputs_max: 4,
        ..Limits::default()
    }
}

/// The session id of universe slot `i`.
pub fn sid(i: u8) -> SessionId {
    let mut bytes = [0x5e; 16];
    bytes[15] = i % SESSIONS;
    SessionId(bytes)
}

/// Whether `s` is one of the universe's fixed slots (not a fresh id).
pub fn in_universe(s: &SessionId) -> bool {
    (0..SESSIONS).any(|i| sid(i) == *s)
}

/// A revision no session ever holds.
pub fn unknown_revision() -> RevisionId {
    RevisionId([0xee; 32])
}

/// Which revision a command names.
#[derive(Clone, Debug)]
pub enum Rev {
    /// The session's head.
    Head,
    /// `Expected::Any` (for turns; the head elsewhere).
    Any,
    /// One of the session's own revisions (often stale).
    Own(u8),
    /// One of the session's own revisions other than the head, if it has any.
    Past(u8),
    /// A revision of any session.
    Foreign(u8),
    /// A revision nobody holds.
    Unknown,
    /// `Expected::Version`: the session's stream seq, or (for 1 in 4) one off it (for
    /// turns; the head elsewhere).
    Version(u8),
}

/// A message: role, body, content type and attachment choices.
#[derive(Clone, Debug)]
pub struct Msg {
    role: u8,
    body: u8,
    content_type: u8,
    attachment: u8,
}

/// Host state changes: (name, value) pairs to set, names to remove.
pub type State = (Vec<(u8, u8)>, Vec<u8>);

fn state() -> impl Strategy<Value = State> {
    (vec((any::<u8>(), any::<u8>()), 0..=2), vec(any::<u8>(), 0..=1))
}

/// Host state name `i`: mostly one of a few, now and then empty or over the limit.
fn state_name(i: u8) -> String {
    pick(i, &["tool", "model", "plugin"], &["", "a-name-over-16-bytes"])
}

fn state_changes((set, remove): &State) -> StateChanges {
    StateChanges {
        set: set.iter().map(|(n, v)| (state_name(*n), blob(*v, &["on", "off"]))).collect(),
        remove: remove.iter().map(|n| state_name(*n)).collect(),
    }
}

/// One abstract operation.
#[derive(Clone, Debug)]
pub enum Op {
    /// Create a session in slot `s`.
    Create { s: u8, labels: Vec<(u8, u8)>, metadata: u8, messages: Vec<Msg> },
    /// Commit a turn.
    Commit {
        s: u8,
        turn: u8,
        expected: Rev,
        messages: Vec<Msg>,
        usage: Vec<(u8, u8, u8)>,
        context: Vec<u8>,
        tools: Vec<u8>,
        run: Option<u8>,
        state: State,
        draft: Option<u8>,
        inputs: Vec<u8>,
    },
    /// Queue an input.
    Enqueue { s: u8, input: u8, message: Msg, active: bool },
    /// Claim inputs with a token near the current one.
    Claim { s: u8, token: u8, owner: u8, target: u8, ttl: u8, max: u8 },
    /// Abandon a claim.
    Abandon { s: u8, claim: u8 },
    /// Cancel an input.
    Cancel { s: u8, input: u8 },
    /// Append a segment to a draft.
    Draft { s: u8, draft: u8, segment: u8 },
    /// Discard a draft.
    Discard { s: u8, draft: u8 },
    /// Replace the metadata.
    Metadata { s: u8, metadata: u8, expected: Rev },
    /// Set and remove host state entries.
    HostState { s: u8, state: State, expected: Rev },
    /// Send again a turn sent before, verbatim or against another head.
    Retry { pick: u8, expected: Option<Rev> },
    /// Rewrite a range.
    Rewrite { s: u8, expected: Rev, start: u8, end: u8, replacement: Vec<Msg>, reason: u8, note: u8 },
    /// Restore a revision.
    Restore { s: u8, expected: Rev, target: Rev, note: u8 },
    /// Fork slot `parent` into slot `child`.
    Fork { parent: u8, child: u8, index: u8, replacement: Option<Msg>, labels: Option<Vec<(u8, u8)>> },
    /// Archive.
    Archive { s: u8, reason: u8 },
    /// Revive.
    Revive { s: u8, reason: u8 },
    /// Append context.
    Context { s: u8, key: u8, content: u8, source: u8 },
    /// T1.
    ToolCall { s: u8, op: u8, call: u8, tool: u8, args: u8, parent: Option<u8>, turn: Option<u8>, safe: bool },
    /// T2.
    ToolResult { s: u8, op: u8, outcome: u8, result: u8 },
    /// Set and remove labels.
    Labels { s: u8, set: Vec<(u8, u8)>, remove: Vec<u8> },
    /// Take (or, for the holder, renew) the lease of `s` as owner `owner`.
    Acquire { s: u8, owner: u8, ttl: u8 },
    /// Renew the lease of `s` with a token near its current one.
    Renew { s: u8, token: u8, ttl: u8 },
    /// Release the lease of `s` with a token near its current one.
    Release { s: u8, token: u8 },
    /// `op`, fenced on the session it writes (or another) with a token near the current.
    Fenced { s: u8, token: u8, op: Box<Op> },
    /// Move the writer's clock forward by `ms`.
    Advance { ms: u16 },
    /// A batch (inside a batch: an empty nested batch).
    Batch(Vec<Op>),
    /// Compare every query now.
    Check,
    /// Checkpoint the whole delta now ([`Engine::checkpoint`]).
    Checkpoint,
    /// Close the engine, do `projections` to its projections file, and open the same
    /// file again with `policy`.
    Reopen { policy: Policy, projections: AtOpen },
    /// Close, purge a session (and its fork descendants, if asked), reopen.
    Purge { s: u8, descendants: bool, policy: Policy },
    /// Collect unreachable content online ([`Engine::collect_garbage`]), `rows` content
    /// rows per batch.
    Collect { rows: u8 },
}

/// When the engine checkpoints its delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// [`CheckpointPolicy::default`].
    Default,
    /// A checkpoint every `events` events (1 to 7) and every millisecond.
    Eager { events: u8 },
    /// No checkpoint before close.
    Lazy,
    /// No checkpoint by count or age, but a delta bound of `bytes`, which most commits
    /// cross: the writer then waits for the checkpointer (backpressure).
    Bounded { bytes: u16 },
}

impl Policy {
    /// The engine's policy.
    pub fn checkpoint(self) -> CheckpointPolicy {
        let never = CheckpointPolicy {
            events: u64::MAX,
            delta_bytes: u64::MAX,
            interval: Duration::from_secs(3600),
            delta_bytes_max: u64::MAX,
        };
        match self {
            Policy::Default => CheckpointPolicy::default(),
            Policy::Eager { events } => CheckpointPolicy {
                events: u64::from(events),
                interval: Duration::from_millis(1),
                ..CheckpointPolicy::default()
            },
            Policy::Lazy => never,
            Policy::Bounded { bytes } => CheckpointPolicy { delta_bytes_max: u64::from(bytes), ..never },
        }
    }
}

/// What happens to the projections file while the engine is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtOpen {
    /// Nothing: the open folds nothing (close checkpointed the whole delta).
    Keep,
    /// It is deleted: the open rebuilds it from the whole log.
    Delete,
    /// It is replaced by a copy taken at an earlier close (the `n`th, modulo their
    /// number), as a crash with the delta since then unflushed would leave it: the open
    /// folds the log past that copy's checkpoint. Without an earlier close, nothing
    /// happens.
    Stale(u8),
}

/// How much likelier each common choice is than each rare one.
const COMMON_WEIGHT: usize = 30;

/// Picks one of `common` most of the time and one of `rare` now and then.
fn pick(i: u8, common: &[&str], rare: &[&str]) -> String {
    let i = i as usize % (common.len() * COMMON_WEIGHT + rare.len());
    match i.checked_sub(common.len() * COMMON_WEIGHT) {
        Some(r) => rare[r].to_string(),
        None => common[i % common.len()].to_string(),
    }
}

fn turn_id(i: u8) -> String {
    pick(i, &["t0", "t1", "t2", "t3"], &["", "turn-id-too-long-x"])
}

fn context_key(i: u8) -> String {
    pick(i, &["k0", "k1", "k2"], &["", "context-key-too-long"])
}

fn op_id(i: u8) -> String {
    pick(i, &["o0", "o1", "o2"], &["o9", "", "op-id-that-is-too-long"])
}

fn note(i: u8) -> String {
    pick(i, &["", "n", "tidy"], &["note-too-long-here"])
}

fn label_key(i: u8) -> String {
    pick(i, &["a", "b", "c", "d"], &["", "keytoolong"])
}

fn label_value(i: u8) -> String {
    pick(i, &["1", "2", ""], &["valtoolong"])
}

fn body(i: u8) -> Vec<u8> {
    match i % 100 {
        96 => vec![b'm'; 20],
        97 => vec![b'w'; 50],
        98 => vec![b'x'; 52],
        99 => vec![b'y'; 70],
        n => ["hi", "ok", "yes", "no", "", "a"][n as usize % 6].as_bytes().to_vec(),
    }
}

fn message(m: &Msg) -> Message {
    let role = [Role::System, Role::User, Role::Assistant, Role::Tool][m.role as usize % 4];
    let content_type = pick(m.content_type, &["text/plain", "application/json"], &["", "text/too-long-subtype"]);
    let attachments = match m.attachment % 40 {
        38 => vec![b"att".to_vec()],
        39 => vec![b"a1".to_vec(), b"a2".to_vec()],
        _ => Vec::new(),
    };
    Message { role, content_type, body: body(m.body), attachments }
}

fn blob(i: u8, common: &[&str]) -> Vec<u8> {
    let n_common = common.len() * COMMON_WEIGHT;
    match (i as usize) % (n_common + 3) {
        n if n < n_common => common[n % common.len()].as_bytes().to_vec(),
        n if n == n_common => b"  \n".to_vec(),
        n if n == n_common + 1 => Vec::new(),
        _ => vec![b'z'; 65],
    }
}

fn labels(pairs: &[(u8, u8)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (label_key(*k), label_value(*v))).collect()
}

fn msg() -> impl Strategy<Value = Msg> {
    (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(role, body, content_type, attachment)| Msg {
        role,
        body,
        content_type,
        attachment,
    })
}

/// Messages of a turn or a replacement: usually `usual`, now and then none or one too
/// many.
fn msgs(usual: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<Msg>> {
    let over = *usual.end() + 1;
    prop_oneof![
        20 => vec(msg(), usual),
        1 => Just(Vec::new()),
        1 => vec(msg(), over..=over),
    ]
}

/// A short list of references: mostly none or one, now and then two (possibly the
/// same twice) or more than a turn may carry.
fn refs() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        30 => Just(Vec::new()),
        12 => vec(any::<u8>(), 1..=1),
        3 => vec(any::<u8>(), 2..=2),
        1 => vec(any::<u8>(), 4..=4),
    ]
}

fn rev() -> impl Strategy<Value = Rev> {
    prop_oneof![
        8 => Just(Rev::Head),
        2 => Just(Rev::Any),
        3 => any::<u8>().prop_map(Rev::Own),
        1 => any::<u8>().prop_map(Rev::Foreign),
        1 => Just(Rev::Unknown),
        2 => any::<u8>().prop_map(Rev::Version),
    ]
}

/// A session slot for a new session; [`SESSIONS`] stands for a fresh UUIDv7 id.
fn slot() -> impl Strategy<Value = u8> {
    prop_oneof![6 => 0..SESSIONS, 1 => Just(SESSIONS)]
}

/// The id a new session in slot `s` gets.
fn new_id(s: u8) -> SessionId {
    if s == SESSIONS {
        new_session_id()
    } else {
        sid(s)
    }
}

/// A session to act on: mostly an existing one (see [`target`]).
fn session() -> impl Strategy<Value = u8> {
    any::<u8>()
}

fn label_pairs(max: usize) -> impl Strategy<Value = Vec<(u8, u8)>> {
    vec((any::<u8>(), any::<u8>()), 0..=max)
}

fn metadata() -> impl Strategy<Value = u8> {
    any::<u8>()
}

/// A create that the engine accepts unless the slot is taken.
pub fn valid_create() -> impl Strategy<Value = Op> {
    (slot(), vec(msg().prop_map(|m| Msg { body: m.body % 6, content_type: 0, attachment: 0, ..m }), 0..=2))
        .prop_map(|(s, messages)| Op::Create { s, labels: vec![(0, 0)], metadata: 0, messages })
}

/// One operation that is not a batch.
pub fn single() -> impl Strategy<Value = Op> {
    let create = (slot(), label_pairs(3), metadata(), msgs(0..=2))
        .prop_map(|(s, labels, metadata, messages)| Op::Create { s, labels, metadata, messages });
    let commit =
        (
            (session(), any::<u8>(), rev()),
            msgs(0..=3),
            vec((any::<u8>(), any::<u8>(), any::<u8>()), 0..=2),
            refs(),
            refs(),
            proptest::option::weighted(0.2, any::<u8>()),
            prop_oneof![4 => Just((Vec::new(), Vec::new())), 1 => state()],
            proptest::option::weighted(0.2, any::<u8>()),
            prop_oneof![4 => Just(Vec::new()), 1 => vec(any::<u8>(), 1..=2)],
        )
            .prop_map(|((s, turn, expected), messages, usage, context, tools, run, state, draft, inputs)| {
                Op::Commit { s, turn, expected, messages, usage, context, tools, run, state, draft, inputs }
            });
    let metadata =
        (session(), any::<u8>(), rev()).prop_map(|(s, metadata, expected)| Op::Metadata { s, metadata, expected });
    let host_state = (session(), state(), rev()).prop_map(|(s, state, expected)| Op::HostState { s, state, expected });
    let retry =
        (any::<u8>(), proptest::option::weighted(0.4, rev())).prop_map(|(pick, expected)| Op::Retry { pick, expected });
    let rewrite = (session(), rev(), any::<u8>(), any::<u8>(), msgs(0..=2), any::<u8>(), any::<u8>()).prop_map(
        |(s, expected, start, end, replacement, reason, note)| Op::Rewrite {
            s,
            expected,
            start,
            end,
            replacement,
            reason,
            note,
        },
    );
    let target = prop_oneof![
        8 => any::<u8>().prop_map(Rev::Past),
        1 => Just(Rev::Head),
        1 => any::<u8>().prop_map(Rev::Foreign),
        1 => Just(Rev::Unknown),
    ];
    let restore = (session(), rev(), target, any::<u8>()).prop_map(|(s, expected, target, note)| Op::Restore {
        s,
        expected,
        target,
        note,
    });
    let fork = (
        session(),
        slot(),
        any::<u8>(),
        proptest::option::weighted(0.4, msg()),
        proptest::option::weighted(0.3, label_pairs(3)),
    )
        .prop_map(|(parent, child, index, replacement, labels)| Op::Fork {
            parent,
            child,
            index,
            replacement,
            labels,
        });
    let archive = (session(), any::<u8>()).prop_map(|(s, reason)| Op::Archive { s, reason });
    let revive = (session(), any::<u8>()).prop_map(|(s, reason)| Op::Revive { s, reason });
    let context = (session(), any::<u8>(), any::<u8>(), any::<u8>())
        .prop_map(|(s, key, content, source)| Op::Context { s, key, content, source });
    let call = (
        (session(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()),
        proptest::option::weighted(0.25, any::<u8>()),
        proptest::option::weighted(0.3, any::<u8>()),
        any::<bool>(),
    )
        .prop_map(|((s, op, call, tool, args), parent, turn, safe)| Op::ToolCall {
            s,
            op,
            call,
            tool,
            args,
            parent,
            turn,
            safe,
        });
    let result = (session(), any::<u8>(), any::<u8>(), any::<u8>())
        .prop_map(|(s, op, outcome, result)| Op::ToolResult { s, op, outcome, result });
    let set_labels =
        (session(), label_pairs(2), vec(any::<u8>(), 0..=1)).prop_map(|(s, set, remove)| Op::Labels { s, set, remove });
    prop_oneof![
        3 => create,
        10 => commit,
        4 => retry,
        3 => rewrite,
        3 => restore,
        2 => fork,
        1 => archive,
        1 => revive,
        3 => context,
        3 => call,
        3 => result,
        2 => set_labels,
        1 => metadata,
        3 => host_state,
        3 => leases(),
        3 => (session(), any::<u8>(), any::<u8>()).prop_map(|(s, draft, segment)| Op::Draft { s, draft, segment }),
        1 => (session(), any::<u8>()).prop_map(|(s, draft)| Op::Discard { s, draft }),
        3 => inbox(),
    ]
}

/// Inbox commands.
fn inbox() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (session(), any::<u8>(), msg(), any::<bool>())
            .prop_map(|(s, input, message, active)| Op::Enqueue { s, input, message, active }),
        3 => (session(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(s, token, owner, target, ttl, max)| Op::Claim { s, token, owner, target, ttl, max }),
        1 => (session(), any::<u8>()).prop_map(|(s, claim)| Op::Abandon { s, claim }),
        1 => (session(), any::<u8>()).prop_map(|(s, input)| Op::Cancel { s, input }),
    ]
}

/// An input id: mostly one of three, now and then an empty or over-long one.
fn input_id(i: u8) -> String {
    pick(i, &["i1", "i2", "i3"], &["", "input-id-too-long"])
}

/// An input the turn consumes: mostly one claimed in `s`, else any id.
fn consumed(model: &Model, s: &SessionId, i: u8) -> String {
    let (claimed, _) = model.claimed_inputs(s);
    match claimed.get(i as usize % claimed.len().max(1)) {
        Some(id) if i < 200 => id.clone(),
        _ => input_id(i),
    }
}

/// A draft id: mostly one of two, now and then an empty or over-long id.
fn draft_id(i: u8) -> String {
    pick(i, &["d1", "d2"], &["", "draft-id-too-long"])
}

/// A lease owner: mostly one of two workers, now and then an empty or over-long id.
fn owner(i: u8) -> String {
    pick(i, &["w1", "w2"], &["", "owner-id-too-long"])
}

/// A lease time to live: mostly short or long, now and then zero or over the maximum.
fn ttl(i: u8) -> u64 {
    match i % 16 {
        0 => 0,
        1 => LEASE_TTL_MS_MAX + 1,
        2..=8 => 100,
        _ => 5_000,
    }
}

/// A token near the current one of `s`: mostly it, now and then one above or below.
fn token(model: &Model, s: &SessionId, i: u8) -> u64 {
    let current = model.lease_token(s);
    match i % 8 {
        0 => current + 1,
        1 => current.saturating_sub(1),
        _ => current,
    }
}

/// Lease commands.
fn leases() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (session(), any::<u8>(), any::<u8>()).prop_map(|(s, owner, ttl)| Op::Acquire { s, owner, ttl }),
        2 => (session(), any::<u8>(), any::<u8>()).prop_map(|(s, token, ttl)| Op::Renew { s, token, ttl }),
        1 => (session(), any::<u8>()).prop_map(|(s, token)| Op::Release { s, token }),
    ]
}

/// A command fenced with a token near the current one.
fn fenced() -> impl Strategy<Value = Op> {
    (session(), any::<u8>(), single()).prop_map(|(s, token, op)| Op::Fenced { s, token, op: Box::new(op) })
}

/// A checkpoint policy: mostly eager or lazy, now and then the default or a tight
/// delta bound.
pub fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        2 => Just(Policy::Default),
        4 => (1u8..8).prop_map(|events| Policy::Eager { events }),
        3 => Just(Policy::Lazy),
        1 => (128u16..2048).prop_map(|bytes| Policy::Bounded { bytes }),
    ]
}

/// A close and an open, with a policy and what happens to the projections file between.
fn reopen() -> impl Strategy<Value = Op> {
    let at_open = prop_oneof![
        3 => Just(AtOpen::Keep),
        2 => Just(AtOpen::Delete),
        3 => any::<u8>().prop_map(AtOpen::Stale),
    ];
    (policy(), at_open).prop_map(|(policy, projections)| Op::Reopen { policy, projections })
}

/// One operation of a sequence.
pub fn op() -> impl Strategy<Value = Op> {
    let member = prop_oneof![20 => single(), 2 => fenced(), 1 => Just(Op::Batch(Vec::new()))];
    let members = prop_oneof![12 => vec(member.clone(), 0..=4), 1 => vec(member, 5..=5)];
    prop_oneof![
        30 => single(),
        4 => fenced(),
        2 => (0u16..4000).prop_map(|ms| Op::Advance { ms }),
        4 => members.prop_map(Op::Batch),
        1 => Just(Op::Check),
        1 => Just(Op::Checkpoint),
        1 => reopen(),
        1 => (session(), any::<bool>(), policy()).prop_map(|(s, descendants, policy)| Op::Purge { s, descendants, policy }),
        1 => (1u8..8).prop_map(|rows| Op::Collect { rows }),
    ]
}

/// A sequence: one create, so that most sequences have a session to work on, then up
/// to `max` operations.
pub fn sequence(max: usize) -> impl Strategy<Value = Vec<Op>> {
    (valid_create(), vec(op(), 0..max)).prop_map(|(first, rest)| std::iter::once(first).chain(rest).collect())
}

/// Turns sent so far, for retries.
#[derive(Default)]
pub struct History {
    sent: Vec<CommitTurn>,
    committed: Vec<CommitTurn>,
}

impl History {
    /// Remembers every turn `command` carries, and which ones `outcome` committed.
    pub fn record(&mut self, command: &Command, outcome: Option<&Outcome>) {
        match (command, outcome) {
            (Command::CommitTurn(c), o) => {
                self.sent.push(c.clone());
                if let Some(Outcome::Committed(_)) = o {
                    self.committed.push(c.clone());
                }
            }
            (Command::Batch(cs), Some(Outcome::Batch(os))) => {
                cs.iter().zip(os).for_each(|(c, o)| self.record(c, Some(o)))
            }
            (Command::Batch(cs), _) => cs.iter().for_each(|c| self.record(c, None)),
            _ => {}
        }
    }

    /// A turn to send again: mostly one that was committed.
    fn pick(&self, i: u8) -> Option<&CommitTurn> {
        let list = if i < 200 && !self.committed.is_empty() { &self.committed } else { &self.sent };
        list.get(i as usize % list.len().max(1))
    }
}

/// Context key `k`: mostly one pending in `s`, else any key.
fn apply_key(model: &Model, s: &SessionId, k: u8) -> String {
    let pending = model.sessions.get(s).map(|x| x.pending_keys()).unwrap_or_default();
    match pending.get(k as usize % pending.len().max(1)) {
        Some(key) if k < 200 => key.clone(),
        _ => context_key(k),
    }
}

/// Op id `o`: mostly one recorded in `s`, else any id.
fn known_op(model: &Model, s: &SessionId, o: u8) -> String {
    let ops = model.sessions.get(s).map(|x| x.op_ids()).unwrap_or_default();
    match ops.get(o as usize % ops.len().max(1)) {
        Some(op) if o < 180 => op.clone(),
        _ => op_id(o),
    }
}

/// The session `s` names: usually an existing one, now and then any slot.
pub fn target(model: &Model, s: u8) -> SessionId {
    let existing = model.by_creation();
    match s {
        0..=23 => sid(s),
        _ if existing.is_empty() => sid(s),
        _ => existing[s as usize % existing.len()].id(),
    }
}

/// Messages in `s` now (0 when it does not exist).
fn len_of(model: &Model, s: &SessionId) -> u64 {
    model.sessions.get(s).map_or(0, |x| x.messages.len() as u64)
}

/// A rewrite range from two choices: mostly inside the transcript, now and then
/// reaching past its end or inverted.
fn range(len: u64, start: u8, end: u8) -> (u64, u64) {
    let start = match start {
        0..=249 => u64::from(start) % (len + 1),
        _ => len + u64::from(start - 249),
    };
    let end = match end {
        0..=239 => (start + u64::from(end % 3)).min(len),
        240..=249 => start + u64::from(end % 3),
        _ => start.saturating_sub(1),
    };
    (start, end)
}

fn expected_of(model: &Model, s: &SessionId, r: &Rev) -> Expected {
    match r {
        Rev::Any => Expected::Any,
        Rev::Version(off) => {
            let at = model.sessions.get(s).map_or(0, |x| x.stream_seq);
            Expected::Version(match off % 8 {
                0 => at + 1,
                1 => at.saturating_sub(1),
                _ => at,
            })
        }
        other => Expected::Exact(revision(model, s, other)),
    }
}

fn revision(model: &Model, s: &SessionId, r: &Rev) -> RevisionId {
    let Some(session) = model.sessions.get(s) else {
        return unknown_revision();
    };
    match r {
        Rev::Head | Rev::Any | Rev::Version(_) => session.revision(),
        Rev::Own(i) => session.nodes[*i as usize % session.nodes.len()].id,
        Rev::Past(i) => {
            let head = session.revision();
            let past: Vec<RevisionId> = session.nodes.iter().map(|n| n.id).filter(|r| *r != head).collect();
            past.get(*i as usize % past.len().max(1)).copied().unwrap_or(head)
        }
        Rev::Foreign(i) => {
            let all = model.all_revisions();
            all[*i as usize % all.len()]
        }
        Rev::Unknown => unknown_revision(),
    }
}

/// The concrete command `op` stands for, given the model's state. A batch resolves each
/// member against the state its predecessors leave behind.
pub fn resolve(op: &Op, model: &Model, history: &History) -> Command {
    match op {
        Op::Batch(members) => {
            let mut scratch = model.clone();
            let mut commands = Vec::with_capacity(members.len());
            for m in members {
                let c = match m {
                    Op::Batch(_)
                    | Op::Check
                    | Op::Checkpoint
                    | Op::Reopen { .. }
                    | Op::Purge { .. }
                    | Op::Collect { .. }
                    | Op::Advance { .. } => Command::Batch(Vec::new()),
                    single => resolve(single, &scratch, history),
                };
                let _ = scratch.apply(&c);
                commands.push(c);
            }
            Command::Batch(commands)
        }
        Op::Check | Op::Checkpoint | Op::Reopen { .. } | Op::Purge { .. } | Op::Collect { .. } | Op::Advance { .. } => {
            Command::Batch(Vec::new())
        }
        Op::Acquire { s, owner: o, ttl: t } => {
            Command::AcquireLease(AcquireLease { session: target(model, *s), owner: owner(*o), ttl_ms: ttl(*t) })
        }
        Op::Renew { s, token: t, ttl: l } => {
            let session = target(model, *s);
            Command::RenewLease(RenewLease { session, token: token(model, &session, *t), ttl_ms: ttl(*l) })
        }
        Op::Release { s, token: t } => {
            let session = target(model, *s);
            Command::ReleaseLease { session, token: token(model, &session, *t) }
        }
        Op::Fenced { s, token: t, op } => {
            let command = resolve(op, model, history);
            // Mostly the session the command writes (a fork's parent), now and then another.
            let own = match command.unfenced() {
                Command::Fork(f) => Some(f.parent),
                c => c.session(),
            };
            let session = match own {
                Some(own) if *s < 200 => own,
                _ => target(model, *s),
            };
            let fence = Fence { session, token: token(model, &session, *t) };
            Command::Fenced { fence, command: Box::new(command) }
        }
        Op::Create { s, labels: l, metadata, messages } => Command::CreateSession(CreateSession {
            session: new_id(*s),
            labels: labels(l),
            metadata: match metadata % 24 {
                0..=14 => Vec::new(),
                15..=22 => b"meta".to_vec(),
                _ => b"metadata!".to_vec(),
            },
            messages: messages.iter().map(message).collect(),
        }),
        Op::Metadata { s, metadata, expected } => {
            let session = target(model, *s);
            Command::SetMetadata(SetMetadata {
                session,
                metadata: match metadata % 8 {
                    0 => Vec::new(),
                    1..=3 => b"meta".to_vec(),
                    4..=6 => b"meta-2".to_vec(),
                    _ => b"metadata!".to_vec(),
                },
                expected: expected_of(model, &session, expected),
            })
        }
        Op::HostState { s, state, expected } => {
            let session = target(model, *s);
            Command::SetHostState(SetHostState {
                session,
                state: state_changes(state),
                expected: expected_of(model, &session, expected),
            })
        }
        Op::Draft { s, draft, segment } => Command::AppendDraft(AppendDraft {
            session: target(model, *s),
            draft_id: draft_id(*draft),
            segment: blob(*segment, &["ab", "cde"]),
        }),
        Op::Discard { s, draft } => Command::DiscardDraft { session: target(model, *s), draft_id: draft_id(*draft) },
        Op::Enqueue { s, input, message: m, active } => Command::EnqueueInput(EnqueueInput {
            session: target(model, *s),
            input_id: input_id(*input),
            message: message(m),
            kind: if *active { InputKind::ActiveTurn } else { InputKind::NextTurn },
        }),
        Op::Claim { s, token: t, owner: o, target: to, ttl: l, max } => {
            let session = target(model, *s);
            Command::ClaimInputs(ClaimInputs {
                session,
                token: token(model, &session, *t),
                owner: owner(*o),
                target: match to % 4 {
                    0 => ClaimTarget::NextTurn,
                    1 => ClaimTarget::NextTurn,
                    _ => ClaimTarget::Turn(turn_id(*to / 4)),
                },
                ttl_ms: ttl(*l),
                max: u64::from(max % 5),
            })
        }
        Op::Abandon { s, claim } => {
            let session = target(model, *s);
            let (_, claims) = model.claimed_inputs(&session);
            let claim = match claims.get(*claim as usize % claims.len().max(1)) {
                Some(c) if *claim < 220 => *c,
                _ => u64::from(*claim),
            };
            Command::AbandonClaim { session, claim }
        }
        Op::Cancel { s, input } => Command::CancelInput { session: target(model, *s), input_id: input_id(*input) },
        Op::Commit { s, turn, expected, messages, usage, context, tools, run, state, draft, inputs } => {
            let session = target(model, *s);
            Command::CommitTurn(CommitTurn {
                session,
                turn_id: turn_id(*turn),
                expected: expected_of(model, &session, expected),
                messages: messages.iter().map(message).collect(),
                usage: usage
                    .iter()
                    .map(|(who, input, output)| Usage {
                        provider: pick(*who, &["p", "q"], &[""]),
                        model: pick(who / 17, &["m", "n"], &[""]),
                        input: u64::from(*input),
                        output: u64::from(*output),
                        cache_read: u64::from(input / 3),
                        cache_write: u64::from(output / 5),
                    })
                    .collect(),
                applied_context: context.iter().map(|k| apply_key(model, &session, *k)).collect(),
                tool_ops: tools.iter().map(|o| known_op(model, &session, *o)).collect(),
                run_id: run.map(|r| pick(r, &["run-1"], &["", "run-id-is-too-long"])),
                state: state_changes(state),
                draft: draft.map(draft_id),
                inputs: inputs.iter().map(|i| consumed(model, &session, *i)).collect(),
            })
        }
        Op::Retry { pick: i, expected } => {
            let Some(turn) = history.pick(*i) else {
                return Command::Batch(Vec::new());
            };
            let mut turn = turn.clone();
            if let Some(r) = expected {
                turn.expected = expected_of(model, &turn.session, r);
            }
            Command::CommitTurn(turn)
        }
        Op::Rewrite { s, expected, start, end, replacement, reason, note: n } => {
            let session = target(model, *s);
            let (start, end) = range(len_of(model, &session), *start, *end);
            Command::Rewrite(Rewrite {
                session,
                expected: revision(model, &session, expected),
                start,
                end,
                replacement: replacement.iter().map(message).collect(),
                reason: [RewriteReason::Edit, RewriteReason::Compaction, RewriteReason::Redaction]
                    [*reason as usize % 3],
                note: note(*n),
                actor: note(n / 7),
            })
        }
        Op::Restore { s, expected, target: to, note: n } => {
            let session = target(model, *s);
            Command::Restore(Restore {
                session,
                expected: revision(model, &session, expected),
                target: revision(model, &session, to),
                note: note(*n),
                actor: note(n / 7),
            })
        }
        Op::Fork { parent, child, index, replacement, labels: l } => {
            let parent = target(model, *parent);
            Command::Fork(Fork {
                parent,
                session: new_id(*child),
                index: u64::from(*index) % (len_of(model, &parent) + 2),
                replacement: replacement.as_ref().map(message),
                labels: l.as_ref().map(|l| labels(l)),
            })
        }
        Op::Archive { s, reason } => Command::Archive { session: target(model, *s), reason: note(*reason) },
        Op::Revive { s, reason } => {
            let archived: Vec<SessionId> =
                model.by_creation().into_iter().filter(|x| x.archived()).map(|x| x.id()).collect();
            let session = match archived.get(*s as usize % archived.len().max(1)) {
                Some(id) if *s >= 24 => *id,
                _ => target(model, *s),
            };
            Command::Revive { session, reason: note(*reason) }
        }
        Op::Context { s, key, content, source } => Command::AppendContext(AppendContext {
            session: target(model, *s),
            key: context_key(*key),
            content: blob(*content, &["alpha", "beta"]),
            source: note(*source),
        }),
        Op::ToolCall { s, op, call, tool, args, parent, turn, safe } => {
            let session = target(model, *s);
            Command::RecordToolCall(RecordToolCall {
                session,
                op_id: op_id(*op),
                call_id: pick(*call, &["c0", "c1"], &[""]),
                tool_name: pick(*tool, &["ls", "cat"], &[""]),
                args: blob(*args, &["x", "y"]),
                parent_op: parent.map(|p| known_op(model, &session, p)),
                turn_id: turn.map(turn_id),
                recovery: if *safe { Recovery::ReplaySafe } else { Recovery::NotReplaySafe },
            })
        }
        Op::ToolResult { s, op, outcome, result } => {
            let open = model.unsettled_ops();
            let (session, op_id) = match open.get(*op as usize % open.len().max(1)) {
                Some(pair) if *s >= 128 => pair.clone(),
                _ => {
                    let session = target(model, *s);
                    (session, known_op(model, &session, *op))
                }
            };
            Command::RecordToolResult(RecordToolResult {
                session,
                op_id,
                outcome: [ToolOutcome::Ok, ToolOutcome::Error, ToolOutcome::Cancelled][*outcome as usize % 3],
                result: blob(*result, &["r", "s"]),
            })
        }
        Op::Labels { s, set, remove } => Command::SetLabels(SetLabels {
            session: target(model, *s),
            set: labels(set),
            remove: remove.iter().map(|k| label_key(*k)).collect(),
        }),
    }
}
