//! The client against a real three-node JetStream cluster on loopback, with TLS and
//! authorization on (`tests/cluster`, Debian's `nats-server`).

mod cluster;

use annal_codec::SessionId;
use annal_jetstream::{Append, Credentials, Error, Expected, JetStreamLog, Options, Outcome, Target, Tls};
use cluster::Cluster;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn append(target: Target, payload: &str, expected: Expected, msg_id: Option<&str>) -> Append {
    Append { target, payload: payload.as_bytes().to_vec(), expected, msg_id: msg_id.map(Into::into) }
}

/// The sequences of outcomes that must all be fresh stores.
fn stored_seqs(outcomes: &[Outcome]) -> Vec<u64> {
    outcomes
        .iter()
        .map(|o| match o {
            Outcome::Stored { seq, duplicate: false } => *seq,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn session(n: u8) -> SessionId {
    SessionId([n; 16])
}

/// A batch longer than the window: the append awaits its oldest acknowledgement before
/// each publish past it (a publish holds the client's permit until its acknowledgement
/// is awaited, so sending the whole batch first would wait for good), and so do two
/// appends at once on one client.
#[test]
fn a_batch_longer_than_the_window_and_appends_at_once_are_stored_in_order() {
    let cluster = Cluster::start();
    let options = Options { window: 4, ..cluster.client_options("WINDOW") };
    let log = Arc::new(JetStreamLog::connect(&options).unwrap());
    let batch = |tag: &str, n: usize| -> Vec<Append> {
        (0..n).map(|i| append(Target::Many, &format!("{tag}{i}"), Expected::Any, None)).collect()
    };
    let outcomes = log.append(batch("a", 11)).unwrap();
    let seqs = stored_seqs(&outcomes);
    assert_eq!(seqs, (1..=11).collect::<Vec<u64>>());
    let threads: Vec<_> = ["b", "c", "d"]
        .into_iter()
        .map(|tag| {
            let log = log.clone();
            std::thread::spawn(move || log.append(batch(tag, 9)).unwrap().len())
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 9);
    }
    assert_eq!(log.tip().unwrap(), 11 + 27);
    let payloads: Vec<Vec<u8>> = log.read(1, 11).unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(payloads, (0..11).map(|i| format!("a{i}").into_bytes()).collect::<Vec<_>>());
}

#[test]
fn messages_are_stored_in_order_and_read_back() {
    let cluster = Cluster::start();
    let log = JetStreamLog::connect(&cluster.client_options("ORDER")).unwrap();
    assert_eq!(log.tip().unwrap(), 0);
    assert_eq!(log.last_of(&Target::Session(session(1))).unwrap(), None);
    let outcomes = log
        .append(vec![
            append(Target::Session(session(1)), "a1", Expected::NoMessage, Some("t-a1")),
            append(Target::Session(session(2)), "b1", Expected::NoMessage, None),
            append(Target::Many, "x1", Expected::Any, Some("x-1")),
            append(Target::Session(session(1)), "a2", Expected::Any, None),
        ])
        .unwrap();
    let seqs = stored_seqs(&outcomes);
    assert_eq!(seqs, [1, 2, 3, 4]);
    assert_eq!(log.tip().unwrap(), 4);
    assert_eq!(log.last_of(&Target::Session(session(1))).unwrap(), Some(4));
    assert_eq!(log.last_of(&Target::Session(session(2))).unwrap(), Some(2));
    assert_eq!(log.last_of(&Target::Many).unwrap(), Some(3));

    let all = log.read(1, 100).unwrap();
    let got: Vec<(u64, Target, &[u8], Option<&str>)> =
        all.iter().map(|m| (m.seq, m.target, m.payload.as_slice(), m.msg_id.as_deref())).collect();
    assert_eq!(
        got,
        [
            (1, Target::Session(session(1)), &b"a1"[..], Some("t-a1")),
            (2, Target::Session(session(2)), &b"b1"[..], None),
            (3, Target::Many, &b"x1"[..], Some("x-1")),
            (4, Target::Session(session(1)), &b"a2"[..], None),
        ]
    );
    let middle = log.read(2, 2).unwrap();
    assert_eq!(middle.iter().map(|m| m.seq).collect::<Vec<_>>(), [2, 3]);
    assert!(log.read(5, 10).unwrap().is_empty());
    // The leader answers the same, message by message.
    assert_eq!(log.read_from_leader(1, 100).unwrap(), all);
    assert_eq!(log.read_from_leader(2, 2).unwrap(), middle);
    assert_eq!(log.read_from_leader(0, 1).unwrap(), all[..1]);
    assert!(log.read_from_leader(5, 10).unwrap().is_empty());
    assert!(log.read_from_leader(1, 0).unwrap().is_empty());

    // A subscription delivers what is stored, then what comes after.
    let mut sub = log.subscribe(3).unwrap();
    let wait = Duration::from_secs(10);
    assert_eq!(sub.next_within(wait).unwrap().unwrap().seq, 3);
    assert_eq!(sub.next_within(wait).unwrap().unwrap().seq, 4);
    log.append(vec![append(Target::Session(session(2)), "b2", Expected::Last(2), None)]).unwrap();
    let next = sub.next_within(wait).unwrap().unwrap();
    assert_eq!((next.seq, next.payload.as_slice()), (5, &b"b2"[..]));
    assert_eq!(sub.next_within(Duration::from_millis(300)).unwrap(), None);

    // Reconnecting finds the same stream.
    drop(log);
    let again = JetStreamLog::connect(&cluster.client_options("ORDER")).unwrap();
    assert_eq!(again.tip().unwrap(), 5);
}

#[test]
fn expectations_are_a_compare_and_set_per_session_and_retries_are_stored_once() {
    let cluster = Cluster::start();
    let log = JetStreamLog::connect(&cluster.client_options("CAS")).unwrap();
    let s = Target::Session(session(3));
    let first = log.append(vec![append(s, "1", Expected::NoMessage, None)]).unwrap();
    assert_eq!(first, [Outcome::Stored { seq: 1, duplicate: false }]);
    // Decided under "no message yet", or under a stale last message: refused.
    for (expected, outcome) in [
        (Expected::NoMessage, Outcome::Conflict),
        (Expected::Last(7), Outcome::Conflict),
        (Expected::Last(1), Outcome::Stored { seq: 2, duplicate: false }),
        (Expected::Last(1), Outcome::Conflict),
    ] {
        assert_eq!(log.append(vec![append(s, "2", expected, None)]).unwrap(), [outcome], "{expected:?}");
    }
    // Another subject's expectation is its own.
    let other = log.append(vec![append(Target::Session(session(4)), "o", Expected::NoMessage, None)]).unwrap();
    assert_eq!(other, [Outcome::Stored { seq: 3, duplicate: false }]);
    assert_eq!(log.tip().unwrap(), 3);

    // A publish retried after a lost acknowledgement carries the same id: stored once,
    // and the retry learns where.
    let turn = append(s, "turn", Expected::Any, Some("session-3:turn-9"));
    assert_eq!(log.append(vec![turn.clone()]).unwrap(), [Outcome::Stored { seq: 4, duplicate: false }]);
    assert_eq!(log.append(vec![turn.clone(), turn]).unwrap(), [Outcome::Stored { seq: 4, duplicate: true }; 2]);
    assert_eq!(log.tip().unwrap(), 4);
    let payloads: Vec<Vec<u8>> = log.read(1, 10).unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(payloads, [b"1".to_vec(), b"2".to_vec(), b"o".to_vec(), b"turn".to_vec()]);

    // Too large for the servers, headers included: refused before anything is sent,
    // even the messages before it in the batch. Exactly at the limit: stored.
    let max = log.max_payload();
    let sized = |payload: usize, id: &str| Append {
        target: s,
        payload: vec![0; payload],
        expected: Expected::Last(4),
        msg_id: Some(id.into()),
    };
    let headers = "NATS/1.0\r\n".len()
        + "Nats-Expected-Last-Subject-Sequence: 4\r\n".len()
        + "Nats-Msg-Id: at-limit\r\n".len()
        + 2;
    let over = sized(max - headers + 1, "at-limit");
    let small = sized(10, "small");
    assert!(matches!(log.append(vec![small, over]), Err(Error::PayloadTooLarge { .. })));
    assert_eq!(log.tip().unwrap(), 4);
    let at_limit = sized(max - headers, "at-limit");
    assert_eq!(log.append(vec![at_limit]).unwrap(), [Outcome::Stored { seq: 5, duplicate: false }]);
}

/// Two clients, as two hosts, with 16 threads each, race on a few shared sessions: each
/// thread reads a session's last message and appends under it.
///
/// What the servers guarantee: a refused message is not stored, and every acknowledged
/// message is read back as it was sent, at its sequence, in one dense order. What they
/// do not: nats-server 2.9 checks `Nats-Expected-Last-Subject-Sequence` on the stream
/// leader before it replicates, so two messages in flight under the same expectation can
/// both be stored (nats-io/nats-server#4320). That is why the fold, not the server, has
/// the last word (`docs/design.md` §13): a message applies only if it was decided under
/// its session's last applied message, else it is void. The test counts the messages the
/// servers stored under an expectation that no longer held: the ones a fold voids.
#[test]
fn racing_hosts_are_refused_or_stored_and_nothing_acknowledged_is_lost() {
    let cluster = Cluster::start();
    let hosts: Vec<Arc<JetStreamLog>> =
        (0..2).map(|_| Arc::new(JetStreamLog::connect(&cluster.client_options("RACE")).unwrap())).collect();
    // Stream sequence -> (session, the last message it was decided under, payload).
    type Stored = BTreeMap<u64, (SessionId, Option<u64>, Vec<u8>)>;
    let stored: Arc<Mutex<Stored>> = Arc::default();
    let conflicts = Arc::new(Mutex::new(0u64));
    let threads: Vec<_> = (0..32)
        .map(|t| {
            let log = hosts[t % 2].clone();
            let stored = stored.clone();
            let conflicts = conflicts.clone();
            std::thread::spawn(move || {
                for round in 0..15u8 {
                    let s = session(round % 3);
                    // The host's view: the last message it sees applied on the session.
                    let last = log.last_of(&Target::Session(s)).unwrap();
                    let expected = last.map_or(Expected::NoMessage, Expected::Last);
                    let payload = format!("{t}-{round}-{last:?}").into_bytes();
                    let a = Append { target: Target::Session(s), payload: payload.clone(), expected, msg_id: None };
                    match log.append(vec![a]).unwrap()[0] {
                        Outcome::Stored { seq, duplicate: false } => {
                            assert!(stored.lock().unwrap().insert(seq, (s, last, payload)).is_none());
                        }
                        Outcome::Conflict => *conflicts.lock().unwrap() += 1,
                        other => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stored = stored.lock().unwrap();
    let conflicts = *conflicts.lock().unwrap();
    assert_eq!(stored.len() as u64 + conflicts, 32 * 15);
    assert!(conflicts > 0, "32 racing threads on 3 sessions never conflicted");
    let tip = hosts[0].tip().unwrap();
    assert_eq!(tip, stored.len() as u64, "refused messages are not stored");

    let messages = hosts[1].read(1, tip as usize + 10).unwrap();
    assert_eq!(messages.iter().map(|m| m.seq).collect::<Vec<_>>(), (1..=tip).collect::<Vec<_>>());
    let mut last_stored: BTreeMap<SessionId, u64> = BTreeMap::new();
    let mut stale = 0;
    for m in &messages {
        let (s, decided_under, payload) = &stored[&m.seq];
        assert_eq!((&m.target, &m.payload), (&Target::Session(*s), payload), "message {}", m.seq);
        if *decided_under != last_stored.insert(*s, m.seq) {
            stale += 1;
        }
    }
    eprintln!("{} stored, {conflicts} refused, {stale} stored under an expectation that no longer held", tip);
}

#[test]
fn clients_without_the_credentials_or_of_another_account_are_refused_and_write_nothing() {
    let cluster = Cluster::start();
    let good = cluster.client_options("SECURE");
    let log = JetStreamLog::connect(&good).unwrap();
    log.append(vec![append(Target::Session(session(1)), "mine", Expected::NoMessage, None)]).unwrap();

    let anonymous = Options { credentials: Credentials::None, ..good.clone() };
    assert!(matches!(JetStreamLog::connect(&anonymous), Err(Error::Refused(_))), "no credentials");
    let wrong = Options {
        credentials: Credentials::UserPassword { user: cluster.user().0, password: "not-it".into() },
        ..good.clone()
    };
    assert!(matches!(JetStreamLog::connect(&wrong), Err(Error::Refused(_))), "a wrong password");

    // Without TLS, or without trusting the servers' authority: no connection.
    let plain = Options { tls: Tls { required: false, ca_file: None, client_cert: None }, ..good.clone() };
    let plain = Options { servers: plain.servers.iter().map(|u| u.replace("tls://", "nats://")).collect(), ..plain };
    assert!(JetStreamLog::connect(&plain).is_err(), "a client that does not trust the servers' certificate");

    // Another account sees other streams: it neither finds this one nor reaches it.
    let (user, password) = cluster.other_user();
    let other = Options { credentials: Credentials::UserPassword { user, password }, create: false, ..good.clone() };
    assert!(matches!(JetStreamLog::connect(&other), Err(Error::StreamNotFound(_))));
    let other = Options { create: true, ..other };
    let theirs = JetStreamLog::connect(&other).unwrap();
    theirs.append(vec![append(Target::Session(session(1)), "theirs", Expected::Any, None)]).unwrap();
    assert_eq!(theirs.read(1, 10).unwrap().len(), 1);

    let read: Vec<Vec<u8>> = log.read(1, 10).unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(read, [b"mine".to_vec()], "the other account wrote nothing here");

    // A stream of that name with other subjects is not taken for the log.
    let elsewhere = Options { subject_prefix: "elsewhere".into(), ..good };
    assert!(matches!(JetStreamLog::connect(&elsewhere), Err(Error::StreamMismatch { .. })));
}

#[test]
fn a_client_with_an_nkey_of_the_account_connects_and_one_with_another_nkey_is_refused() {
    let cluster = Cluster::start();
    let good = Options { credentials: Credentials::NKey(cluster.nkey_seed()), ..cluster.client_options("NKEY") };
    let log = JetStreamLog::connect(&good).unwrap();
    let stored = log.append(vec![append(Target::Session(session(1)), "signed", Expected::NoMessage, None)]).unwrap();
    assert_eq!(stored, [Outcome::Stored { seq: 1, duplicate: false }]);
    let read: Vec<(u64, Vec<u8>)> = log.read(1, 10).unwrap().into_iter().map(|m| (m.seq, m.payload)).collect();
    assert_eq!(read, [(1, b"signed".to_vec())]);

    // A well-formed user key the servers were never told of.
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let unknown = Options { credentials: Credentials::NKey(stranger), ..good };
    assert!(matches!(JetStreamLog::connect(&unknown), Err(Error::Refused(_))), "an unknown NKey");
    assert_eq!(log.tip().unwrap(), 1, "the refused client wrote nothing");
}

#[test]
fn servers_that_verify_clients_take_only_a_certificate_of_their_authority() {
    let cluster = Cluster::start_with(cluster::ClusterOptions { verify_clients: true });
    let without = cluster.client_options("MTLS");
    assert!(JetStreamLog::connect(&without).is_err(), "no client certificate");
    let with = Options { tls: Tls { client_cert: Some(cluster.client_cert()), ..without.tls.clone() }, ..without };
    let log = JetStreamLog::connect(&with).unwrap();
    let stored = log.append(vec![append(Target::Many, "x", Expected::Any, None)]).unwrap();
    assert_eq!(stored, [Outcome::Stored { seq: 1, duplicate: false }]);
}

/// One server of three is killed while a host appends: no acknowledged message is lost,
/// and appends go on once the remaining two have a leader for the stream.
#[test]
fn a_killed_server_loses_no_acknowledged_message_and_writes_continue() {
    let mut cluster = Cluster::start();
    let opts = cluster.client_options("KILL");
    let log = Arc::new(JetStreamLog::connect(&opts).unwrap());
    let acked: Arc<Mutex<BTreeMap<u64, Vec<u8>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (log, acked, stop) = (log.clone(), acked.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut errors = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let payload = format!("m{n}").into_bytes();
                let id = format!("m{n}");
                let batch = vec![Append {
                    target: Target::Session(session((n % 4) as u8)),
                    payload: payload.clone(),
                    expected: Expected::Any,
                    msg_id: Some(id),
                }];
                match log.append(batch) {
                    Ok(outcomes) => {
                        if let Outcome::Stored { seq, .. } = outcomes[0] {
                            acked.lock().unwrap().insert(seq, payload);
                        }
                        n += 1;
                    }
                    // The same message again, with the same id, until it is stored.
                    Err(_) => {
                        errors += 1;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            errors
        })
    };
    let count = |acked: &Arc<Mutex<BTreeMap<u64, Vec<u8>>>>| acked.lock().unwrap().len();
    wait_until(|| count(&acked) >= 100, "the first 100 acknowledgements");
    // Kill a server that is not the one every client happens to be on: any of them will
    // do, the client fails over.
    cluster.kill(1);
    let at_kill = count(&acked);
    wait_until(|| count(&acked) >= at_kill + 100, "100 more acknowledgements after the kill");
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let tip = log.tip().unwrap();

    // Read while the server is still down, several times: the servers may place a read's
    // consumer on it, and the read then takes the messages from the stream's leader.
    let acked = acked.lock().unwrap();
    let leader: Vec<(u64, Vec<u8>)> =
        log.read_from_leader(1, tip as usize + 10).unwrap().into_iter().map(|m| (m.seq, m.payload)).collect();
    for _ in 0..6 {
        let read: Vec<(u64, Vec<u8>)> =
            log.read(1, tip as usize + 10).unwrap().into_iter().map(|m| (m.seq, m.payload)).collect();
        assert_eq!(read, leader, "a read through a consumer and one from the leader");
    }
    let read: BTreeMap<u64, Vec<u8>> = leader.into_iter().collect();
    assert_eq!(read.len() as u64, tip, "the stream is dense");
    assert_eq!(read.keys().next_back(), Some(&tip));
    for (seq, payload) in acked.iter() {
        assert_eq!(read.get(seq), Some(payload), "acknowledged message {seq}");
    }
    // Each message is stored once, retries included.
    let distinct: std::collections::BTreeSet<&Vec<u8>> = read.values().collect();
    assert_eq!(distinct.len(), read.len());

    cluster.restart(1);
    let after = log.append(vec![append(Target::Many, "after restart", Expected::Any, None)]).unwrap();
    assert!(matches!(after[0], Outcome::Stored { seq, .. } if seq == tip + 1));
}

fn wait_until(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
