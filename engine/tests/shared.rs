//! Hosts of a shared log (`docs/design.md` §13): engines in one process on one
//! `RedbStream`, each folding every host's commands into its own files.

mod common;

use annal::backend::{LogBackend, RedbStream};
use annal::*;
use common::*;
use std::sync::Arc;
use std::time::Duration;

/// A host's files in a fresh directory.
struct Host {
    db: Db,
}

impl Host {
    fn new() -> Host {
        Host { db: Db::new() }
    }

    fn open(&self, stream: &RedbStream) -> Engine {
        let backend: Arc<dyn LogBackend> = Arc::new(stream.clone());
        Engine::open_shared(&self.db.path, Options::default(), backend).unwrap()
    }
}

/// Waits until `engine` has folded the whole stream.
fn caught_up(engine: &Engine, stream: &RedbStream) {
    let tip = stream.tip().unwrap();
    assert!(engine.wait_for_stream(tip, Duration::from_secs(30)), "the fold reaches {tip}");
}

/// Two hosts hold the same log and the same projections.
fn assert_same(a: &Engine, b: &Engine) {
    assert_eq!(all_events(a), all_events(b), "the same records, seqs and chain");
    assert_eq!(a.projection_digests().unwrap(), b.projection_digests().unwrap(), "the same projections");
    assert_eq!(a.tip().unwrap(), b.tip().unwrap());
}

#[test]
fn a_workload_on_one_host_is_folded_alike_by_another_by_a_new_one_and_after_a_reopen() {
    let stream = RedbStream::memory().unwrap();
    let (ha, hb, hc) = (Host::new(), Host::new(), Host::new());
    let a = ha.open(&stream);
    let b = hb.open(&stream);
    let sessions = workload(&a);
    assert!(!sessions.is_empty());
    caught_up(&a, &stream);
    caught_up(&b, &stream);
    assert_same(&a, &b);
    let events = all_events(&a);
    assert_eq!(events.iter().map(|e| e.record.seq).collect::<Vec<_>>(), (1..=events.len() as u64).collect::<Vec<_>>());
    // A host that joins later folds the stream from its first message.
    let c = hc.open(&stream);
    caught_up(&c, &stream);
    assert_same(&a, &c);
    // Commands on the second host reach the first.
    let (s, rev) = create(&b, &[Message::system("from b")]);
    let receipt = b.commit_turn(turn(s, "t1", rev)).unwrap().receipt();
    assert_eq!(head(&b, s).revision, receipt.revision, "read-your-writes on the committing host");
    caught_up(&a, &stream);
    assert_eq!(head(&a, s).revision, receipt.revision);
    // Reopened, a host resumes from its position.
    a.close().unwrap();
    let a = ha.open(&stream);
    caught_up(&a, &stream);
    caught_up(&c, &stream);
    assert_same(&a, &b);
    assert_same(&a, &c);
    assert_eq!(a.host_status().unwrap().lag(), 0);
}

/// (host, round, outcome) of one commit attempt.
type Attempt = (usize, usize, RevisionId, Result<TurnOutcome>, String);

#[test]
fn sixteen_threads_on_each_of_two_hosts_race_and_each_revision_is_won_exactly_once() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 6;
    let stream = RedbStream::memory().unwrap();
    let (ha, hb) = (Host::new(), Host::new());
    let hosts = [ha.open(&stream), hb.open(&stream)];
    let sessions: Vec<(SessionId, RevisionId)> =
        (0..2).map(|i| create(&hosts[i], &[Message::system("shared")])).collect();
    for h in &hosts {
        caught_up(h, &stream);
    }
    let attempts: std::sync::Mutex<Vec<Attempt>> = std::sync::Mutex::new(Vec::new());
    let barrier = std::sync::Barrier::new(2 * THREADS);
    std::thread::scope(|scope| {
        for host in 0..2 {
            for thread in 0..THREADS {
                let (engine, other) = (&hosts[host], &hosts[1 - host]);
                let (sessions, attempts, barrier) = (&sessions, &attempts, &barrier);
                scope.spawn(move || {
                    let (session, _) = sessions[thread % sessions.len()];
                    for round in 0..ROUNDS {
                        barrier.wait();
                        let expected = head(engine, session).revision;
                        let turn_id = format!("h{host}-t{thread}-r{round}");
                        let result = engine.commit_turn(turn(session, &turn_id, expected));
                        if let Ok(outcome) = &result {
                            // The same turn retried on the other host is answered, not
                            // committed again.
                            let receipt = outcome.receipt();
                            assert!(
                                other.wait_for_stream(engine.host_status().unwrap().position, Duration::from_secs(30))
                            );
                            let again = other.commit_turn(turn(session, &turn_id, expected)).unwrap();
                            assert_eq!(
                                again,
                                TurnOutcome::AlreadyCommitted(receipt),
                                "{turn_id} retried on the other host"
                            );
                        }
                        attempts.lock().unwrap().push((host, round, expected, result, turn_id));
                    }
                });
            }
        }
    });
    let attempts = attempts.into_inner().unwrap();
    let mut wins: std::collections::BTreeMap<(SessionId, RevisionId), Vec<String>> = Default::default();
    let mut conflicts = 0;
    for (host, _, expected, result, turn_id) in &attempts {
        let session =
            sessions[turn_id.split("-t").nth(1).unwrap().split('-').next().unwrap().parse::<usize>().unwrap() % 2].0;
        match result {
            Ok(TurnOutcome::Committed(_)) => wins.entry((session, *expected)).or_default().push(turn_id.clone()),
            Ok(other) => panic!("host {host}: {turn_id} gave {other:?}"),
            Err(Error::Rejected(Rejection::RevisionConflict { .. })) => conflicts += 1,
            Err(e) => panic!("host {host}: {turn_id} failed: {e}"),
        }
    }
    for ((_, revision), winners) in &wins {
        assert_eq!(winners.len(), 1, "revision {revision} won by {winners:?}");
    }
    assert!(conflicts > 0, "the hosts raced");
    for h in &hosts {
        caught_up(h, &stream);
    }
    assert_same(&hosts[0], &hosts[1]);
    // Every win is in the log, once, in a dense stream per session.
    let events = all_events(&hosts[0]);
    let turns = events.iter().filter(|e| matches!(e.record.event, Event::TurnCommitted(_))).count();
    assert_eq!(turns, wins.len());
    for (session, _) in &sessions {
        let streams: Vec<u64> = session_events(&hosts[0], *session).iter().map(|e| e.record.stream_seq).collect();
        assert_eq!(streams, (1..=streams.len() as u64).collect::<Vec<_>>());
    }
}

/// A host with a chain key.
fn open_keyed(host: &Host, stream: &RedbStream, key: [u8; 32]) -> Engine {
    let backend: Arc<dyn LogBackend> = Arc::new(stream.clone());
    Engine::open_shared(&host.db.path, Options { chain_key: Some(key), ..Options::default() }, backend).unwrap()
}

#[test]
fn forged_stale_and_malformed_messages_are_void_on_every_host_and_verify_names_the_forged() {
    use annal::backend::{Expected as Expect, Publish, Target};
    use annal::codec::{Event, LogChain, Record, SessionArchived};
    let key = [7u8; 32];
    let stream = RedbStream::memory().unwrap();
    let (ha, hb) = (Host::new(), Host::new());
    let a = open_keyed(&ha, &stream, key);
    let b = open_keyed(&hb, &stream, key);
    let (s, _) = create(&a, &[Message::system("guarded")]);
    caught_up(&b, &stream);
    let before = all_events(&a);
    let archive = |stream_seq: u64| Record {
        seq: 0,
        session: s,
        stream_seq,
        committed_at_ms: 1,
        event: Event::SessionArchived(SessionArchived { reason: "intruder".into() }),
    };
    let limits = Limits::default();
    let publish = |payload: Vec<u8>| {
        let p = Publish { target: Target::Session(s), payload, expected: Expect::Any, msg_id: None };
        stream.append(vec![p]).unwrap();
    };
    // Without the key: a well-formed archive of the session, next in its stream.
    let forged =
        annal::shared::encode_message(&[(archive(2), vec![])], &LogChain::plain(), limits.record_bytes_max).unwrap();
    publish(forged);
    let forged_seq = stream.tip().unwrap();
    // With the key, but decided under a stale state: the session's first record again.
    let keyed = LogChain::keyed(key);
    publish(annal::shared::encode_message(&[(archive(1), vec![])], &keyed, limits.record_bytes_max).unwrap());
    // Bytes that are no message at all.
    publish(b"not a message".to_vec());
    // An authentic message whose record of another session than its subject's.
    let mut elsewhere = archive(1);
    elsewhere.session = SessionId([9; 16]);
    publish(annal::shared::encode_message(&[(elsewhere, vec![])], &keyed, limits.record_bytes_max).unwrap());
    for h in [&a, &b] {
        caught_up(h, &stream);
        assert_eq!(all_events(h), before, "nothing of a void message applies");
        assert!(!head(h, s).archived);
    }
    // The genuine command still applies after them.
    assert!(a.archive(s, "done").unwrap());
    caught_up(&b, &stream);
    assert!(head(&b, s).archived);
    assert_same(&a, &b);
    let report = annal::shared::verify_stream(&stream, &keyed, &limits).unwrap();
    assert_eq!(report.forged, vec![forged_seq], "the message written without the key");
    assert_eq!(report.malformed.len(), 1, "{report:?}");
    assert_eq!(report.messages, stream.tip().unwrap());
    // Under another key, every message is forged.
    let other = annal::shared::verify_stream(&stream, &LogChain::keyed([8; 32]), &limits).unwrap();
    assert_eq!(other.forged.len() as u64, report.messages - 1, "all but the bytes too short to be one");
}

#[test]
fn a_command_over_the_backends_limit_fails_alone_and_writes_nothing() {
    let stream = RedbStream::memory().unwrap();
    let host = Host::new();
    let limits = Limits { content_bytes_max: 32 << 20, ..Limits::default() };
    let backend: Arc<dyn LogBackend> = Arc::new(stream.clone());
    let engine = Engine::open_shared(&host.db.path, Options { limits, ..Options::default() }, backend).unwrap();
    let (s, rev) = create(&engine, &[Message::system("small")]);
    let tip = stream.tip().unwrap();
    // Random bytes do not compress: the message is larger than the stream takes.
    let mut noise = vec![0u8; annal::backend::REDB_STREAM_PAYLOAD_MAX as usize + 1024];
    let mut x = 0x9e3779b97f4a7c15u64;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let big = CommitTurn::new(s, "big", Expected::Exact(rev)).message(Message::new(
        Role::Tool,
        "application/octet-stream",
        noise,
    ));
    match engine.commit_turn(big) {
        Err(Error::Backend(annal::backend::BackendError::TooLarge { size, max })) => assert!(size > max),
        other => panic!("an oversized message gave {other:?}"),
    }
    assert_eq!(stream.tip().unwrap(), tip, "nothing was stored");
    // The host goes on.
    engine.commit_turn(turn(s, "small", rev)).unwrap();
}

/// A stream that fails on demand: before storing (`refuse`), after storing with the
/// acknowledgement lost (`lose_ack`), or by going silent: every subscription opened
/// before `mute_before` delivers nothing more, as a consumer lost with a server does.
/// Its subscriptions start `skip` messages past where they are asked to, and it
/// remembers the largest read it was asked for (`largest_read`).
struct Flaky {
    inner: RedbStream,
    refuse: std::sync::atomic::AtomicBool,
    lose_ack: std::sync::atomic::AtomicBool,
    subscriptions: Arc<std::sync::atomic::AtomicU64>,
    mute_before: Arc<std::sync::atomic::AtomicU64>,
    skip: std::sync::atomic::AtomicU64,
    largest_read: std::sync::atomic::AtomicUsize,
}

impl Flaky {
    fn on(stream: &RedbStream) -> Flaky {
        Flaky {
            inner: stream.clone(),
            refuse: false.into(),
            lose_ack: false.into(),
            subscriptions: Default::default(),
            mute_before: Default::default(),
            skip: Default::default(),
            largest_read: Default::default(),
        }
    }

    /// Silences every subscription opened so far.
    fn mute(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.mute_before.store(self.subscriptions.load(SeqCst), SeqCst);
    }
}

/// One of [`Flaky`]'s subscriptions: the stream's, until it is muted.
struct MaybeSilent {
    inner: Box<dyn annal::backend::Subscription>,
    id: u64,
    mute_before: Arc<std::sync::atomic::AtomicU64>,
}

impl annal::backend::Subscription for MaybeSilent {
    fn next_within(
        &mut self,
        wait: Duration,
    ) -> std::result::Result<Option<annal::backend::StreamMessage>, annal::backend::BackendError> {
        if self.id < self.mute_before.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(wait);
            return Ok(None);
        }
        self.inner.next_within(wait)
    }
}

impl LogBackend for Flaky {
    fn append(
        &self,
        batch: Vec<annal::backend::Publish>,
    ) -> std::result::Result<Vec<annal::backend::Published>, annal::backend::BackendError> {
        use std::sync::atomic::Ordering::SeqCst;
        let down = || annal::backend::BackendError::Unavailable("the servers did not answer".into());
        if self.refuse.load(SeqCst) {
            return Err(down());
        }
        let stored = self.inner.append(batch)?;
        match self.lose_ack.swap(false, SeqCst) {
            true => Err(down()),
            false => Ok(stored),
        }
    }
    fn read(
        &self,
        from: u64,
        max: usize,
    ) -> std::result::Result<Vec<annal::backend::StreamMessage>, annal::backend::BackendError> {
        self.largest_read.fetch_max(max, std::sync::atomic::Ordering::SeqCst);
        self.inner.read(from, max)
    }
    fn tip(&self) -> std::result::Result<u64, annal::backend::BackendError> {
        self.inner.tip()
    }
    fn last_of(
        &self,
        target: &annal::backend::Target,
    ) -> std::result::Result<Option<u64>, annal::backend::BackendError> {
        self.inner.last_of(target)
    }
    fn subscribe(
        &self,
        from: u64,
    ) -> std::result::Result<Box<dyn annal::backend::Subscription>, annal::backend::BackendError> {
        let id = self.subscriptions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let inner = self.inner.subscribe(from + self.skip.load(std::sync::atomic::Ordering::SeqCst))?;
        Ok(Box::new(MaybeSilent { inner, id, mute_before: self.mute_before.clone() }))
    }
    fn max_payload(&self) -> u64 {
        self.inner.max_payload()
    }
}

/// A host's drafts never go to the stream; they are written to its own log file, at
/// the flush interval and at close, so a host opened again has them.
#[test]
fn a_hosts_drafts_outlive_its_close() {
    let stream = RedbStream::memory().unwrap();
    let host = Host::new();
    let engine = host.open(&stream);
    let (s, _) = create(&engine, &[Message::system("drafts")]);
    engine.append_draft(s, "reply", b"half of a".to_vec()).unwrap();
    engine.append_draft(s, "reply", b"n answer".to_vec()).unwrap();
    engine.close().unwrap();
    let engine = host.open(&stream);
    let drafts = engine.drafts(s, u64::MAX);
    assert_eq!(drafts.len(), 1, "{drafts:?}");
    assert_eq!(drafts[0].segments.concat(), b"half of an answer".to_vec());
    engine.close().unwrap();
}

#[test]
fn a_failed_append_is_a_backend_error_that_poisons_nothing_and_a_retried_turn_is_in_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let stream = RedbStream::memory().unwrap();
    let flaky = Arc::new(Flaky::on(&stream));
    let host = Host::new();
    let engine = Engine::open_shared(&host.db.path, Options::default(), flaky.clone()).unwrap();
    let (s, rev) = create(&engine, &[Message::system("flaky")]);
    // The servers are down: nothing is stored, and the engine is not poisoned.
    flaky.refuse.store(true, SeqCst);
    let tip = stream.tip().unwrap();
    match engine.commit_turn(turn(s, "t1", rev)) {
        Err(Error::Backend(annal::backend::BackendError::Unavailable(_))) => {}
        other => panic!("a refused append gave {other:?}"),
    }
    assert!(!engine.is_poisoned());
    assert_eq!(stream.tip().unwrap(), tip);
    assert_eq!(head(&engine, s).revision, rev);
    // Back up: the retry commits.
    flaky.refuse.store(false, SeqCst);
    let first = engine.commit_turn(turn(s, "t1", rev)).unwrap();
    assert!(matches!(first, TurnOutcome::Committed(_)));
    // Stored, but the acknowledgement is lost: the caller gets an error, and its retry
    // finds the turn in, once.
    let rev = first.receipt().revision;
    flaky.lose_ack.store(true, SeqCst);
    assert!(matches!(engine.commit_turn(turn(s, "t2", rev)), Err(Error::Backend(_))));
    let again = engine.commit_turn(turn(s, "t2", rev)).unwrap();
    caught_up(&engine, &stream);
    let turns: Vec<String> = session_events(&engine, s)
        .iter()
        .filter_map(|e| match &e.record.event {
            Event::TurnCommitted(t) => Some(t.turn_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(turns, vec!["t1".to_string(), "t2".to_string()], "each turn once");
    assert_eq!(head(&engine, s).revision, again.receipt().revision);
    // Stored, the acknowledgement lost, and the retry brings other content under the
    // same turn id: a turn conflict, as an embedded engine answers, never a receipt for
    // content that was not stored.
    let rev = again.receipt().revision;
    flaky.lose_ack.store(true, SeqCst);
    assert!(matches!(engine.commit_turn(turn(s, "t3", rev)), Err(Error::Backend(_))));
    let other = CommitTurn::new(s, "t3", Expected::Exact(rev)).message(Message::user("other content"));
    assert_eq!(rejected(engine.commit_turn(other)), Rejection::TurnConflict { turn_id: "t3".into() });
    caught_up(&engine, &stream);
    let last = transcript(engine.reader(), s);
    assert_eq!(last.last().unwrap().message.body, b"answer of t3".to_vec(), "the stored turn is the first's");
    assert!(!engine.is_poisoned());
}

#[test]
fn a_subscription_that_goes_silent_is_replaced_and_the_fold_goes_on() {
    let stream = RedbStream::memory().unwrap();
    let flaky = Arc::new(Flaky::on(&stream));
    let host = Host::new();
    let engine = Engine::open_shared(&host.db.path, Options::default(), flaky.clone()).unwrap();
    let (s, mut rev) = create(&engine, &[Message::system("silent")]);
    // The host's subscription goes silent, as a consumer lost with a server does: the
    // messages after it still reach the fold, and each caller gets its answer (without
    // the pump's watch, the first would wait for the fold until it timed out).
    flaky.mute();
    for i in 0..3 {
        let outcome = engine.commit_turn(turn(s, &format!("t{i}"), rev)).expect("the turn is answered");
        rev = outcome.receipt().revision;
    }
    // Another host's message too.
    let other = Host::new().open(&stream);
    caught_up(&other, &stream);
    let next = other.commit_turn(turn(s, "from-the-other", rev)).unwrap().receipt().revision;
    caught_up(&engine, &stream);
    assert_eq!(head(&engine, s).revision, next);
    assert_same(&engine, &other);
    assert!(flaky.subscriptions.load(std::sync::atomic::Ordering::SeqCst) > 1, "the pump subscribed again");
}

/// A message guarded on a session (the fence of a command that writes other sessions)
/// applies only if the session is where the command was decided: after another message
/// moved it (a takeover of its lease), the guarded message is void on every host, and
/// the same message guarded at the session's new place applies on every host.
#[test]
fn a_message_guarded_on_a_session_that_moved_is_void_on_every_host() {
    use annal::backend::{Expected as Expect, Publish, Target};
    use annal::codec::{Event, LogChain, Record, SessionArchived};
    let stream = RedbStream::memory().unwrap();
    let (ha, hb) = (Host::new(), Host::new());
    let a = ha.open(&stream);
    let b = hb.open(&stream);
    let (parent, _) = create(&a, &[Message::system("fenced by its lease")]);
    let (other, _) = create(&a, &[Message::system("written under the fence")]);
    let decided_at = head(&a, parent).stream_seq + 1;
    // Another worker takes the parent's lease: the parent's stream moves on.
    a.acquire_lease(parent, "another worker", Duration::from_secs(60)).unwrap();
    caught_up(&b, &stream);
    let before = all_events(&a);
    let archive = Record {
        seq: 0,
        session: other,
        stream_seq: head(&a, other).stream_seq + 1,
        committed_at_ms: 1,
        event: Event::SessionArchived(SessionArchived { reason: "under a stale fence".into() }),
    };
    let limits = Limits::default();
    let publish = |guard: u64| {
        let payload = annal::shared::encode_guarded_message(
            &[(archive.clone(), vec![])],
            &[(parent, guard)],
            &LogChain::plain(),
            limits.record_bytes_max,
        )
        .unwrap();
        let p = Publish { target: Target::Session(other), payload, expected: Expect::Any, msg_id: None };
        stream.append(vec![p]).unwrap();
    };
    publish(decided_at);
    for h in [&a, &b] {
        caught_up(h, &stream);
        assert_eq!(all_events(h), before, "nothing of the guarded message applies");
        assert!(!head(h, other).archived);
    }
    publish(head(&a, parent).stream_seq + 1);
    for h in [&a, &b] {
        caught_up(h, &stream);
        assert!(head(h, other).archived, "guarded where the parent is, it applies");
    }
    assert_same(&a, &b);
    let report = annal::shared::verify_stream(&stream, &LogChain::plain(), &limits).unwrap();
    assert!(report.is_clean(), "guarded messages authenticate and decode: {report:?}");
}

/// A host publishes a fenced command that writes another session than its fence's with
/// the fence's session as a guard, at the place the command was decided; a fenced
/// command that writes its fence's session carries no guard (its record's own stream
/// sequence guards it) and keeps the format every release reads.
#[test]
fn a_fenced_command_on_another_session_carries_its_fence_as_a_guard() {
    use annal::codec::LogChain;
    let stream = RedbStream::memory().unwrap();
    let host = Host::new();
    let a = host.open(&stream);
    let (parent, _) = create(&a, &[Message::system("parent")]);
    let (other, _) = create(&a, &[Message::system("other")]);
    let lease = a.acquire_lease(parent, "worker", Duration::from_secs(60)).unwrap();
    let fenced = a.fenced(Fence::new(parent, lease.token));
    let last_message = || {
        let tip = stream.tip().unwrap();
        let m = stream.read(tip, 1).unwrap().pop().unwrap();
        let limits = Limits::default();
        let decoded = annal::shared::decode_message(
            &m.payload,
            &LogChain::plain(),
            limits.record_bytes_max,
            limits.message_object_bytes_max(),
        )
        .unwrap();
        (m.payload, decoded)
    };
    let parent_next = head(&a, parent).stream_seq + 1;
    assert!(fenced.archive(other, "under the fence").unwrap());
    let (payload, message) = last_message();
    assert_eq!(message.guards, vec![(parent, parent_next)]);
    assert_eq!(payload[4], annal::shared::MESSAGE_VERSION_GUARDED);
    assert!(message.records.iter().all(|r| r.session == other));
    fenced.commit_turn(turn(parent, "t1", head(&a, parent).revision)).unwrap();
    let (payload, message) = last_message();
    assert!(message.guards.is_empty());
    assert_eq!(payload[4], annal::shared::MESSAGE_VERSION);
    // After a takeover, the stale fence is refused where it is decided.
    a.release_lease(&lease).unwrap();
    a.acquire_lease(parent, "another worker", Duration::from_secs(60)).unwrap();
    let refused = fenced.revive(other, "after the takeover").unwrap_err();
    assert!(matches!(refused, Error::Rejected(Rejection::Fenced { .. })), "{refused:?}");
}

/// The shared log's message formats, byte for byte: a message without guards (format 1)
/// and one with a guard (format 2), under a keyed chain, against vectors checked into
/// `tests/golden` (`ANNAL_BLESS=1` writes them again after a deliberate change).
#[test]
fn the_message_formats_match_their_golden_vectors() {
    use annal::codec::{Event, LogChain, Record, SessionArchived};
    let record = Record {
        seq: 0,
        session: SessionId([0x42; 16]),
        stream_seq: 2,
        committed_at_ms: 1_767_225_600_000,
        event: Event::SessionArchived(SessionArchived { reason: "golden".into() }),
    };
    let chain = LogChain::keyed([7; 32]);
    let max = Limits::default().record_bytes_max;
    let plain = annal::shared::encode_message(&[(record.clone(), vec![])], &chain, max).unwrap();
    let guard = (SessionId([0x24; 16]), 9);
    let guarded = annal::shared::encode_guarded_message(&[(record.clone(), vec![])], &[guard], &chain, max).unwrap();
    for (name, bytes) in [("shared-message.v1.bin", &plain), ("shared-message.v2.bin", &guarded)] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
        if std::env::var_os("ANNAL_BLESS").is_some() {
            std::fs::write(&path, bytes).unwrap();
        }
        let expected = std::fs::read(&path).unwrap_or_else(|e| panic!("missing golden vector {}: {e}", path.display()));
        assert_eq!(bytes, &expected, "wire format of {name} changed");
        let limits = Limits::default();
        let m = annal::shared::decode_message(&expected, &chain, max, limits.message_object_bytes_max()).unwrap();
        assert_eq!(m.records, vec![record.clone()]);
        assert_eq!(m.guards, if name.contains("v2") { vec![guard] } else { vec![] });
    }
    assert_eq!(&guarded[..5], b"ANNM\x02");
    assert_eq!(&guarded[5..9], &1u32.to_le_bytes());
    assert_eq!(&guarded[9..25], &[0x24; 16]);
    assert_eq!(&guarded[25..33], &9u64.to_le_bytes());
    // After the guards, the entries as format 1 has them; then the MAC.
    assert_eq!(&guarded[33..guarded.len() - 32], &plain[5..plain.len() - 32]);
}

/// A subscription that starts far past the host's position leaves a gap the pump reads
/// from the stream a bounded number of messages at a time (a host far behind does not
/// hold the whole gap in memory), and the host folds every message all the same.
#[test]
fn a_gap_far_behind_the_subscription_is_read_a_bounded_batch_at_a_time() {
    let stream = RedbStream::memory().unwrap();
    let writer = Host::new();
    let a = writer.open(&stream);
    let (s, mut rev) = create(&a, &[Message::system("a long session")]);
    for i in 0..1_500 {
        rev = a.commit_turn(turn(s, &format!("t{i}"), rev)).unwrap().receipt().revision;
    }
    caught_up(&a, &stream);
    let skipping = Arc::new(Flaky::on(&stream));
    skipping.skip.store(1_400, std::sync::atomic::Ordering::SeqCst);
    let late = Host::new();
    let b = Engine::open_shared(&late.db.path, Options::default(), skipping.clone()).unwrap();
    // One more message, which the skipped subscription delivers past the gap.
    a.commit_turn(turn(s, "last", rev)).unwrap();
    caught_up(&b, &stream);
    caught_up(&a, &stream);
    assert_same(&a, &b);
    let largest = skipping.largest_read.load(std::sync::atomic::Ordering::SeqCst);
    assert!(largest <= annal::shared::FOLD_BATCH_MAX, "the pump read {largest} messages at once");
}
