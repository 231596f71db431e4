//! The client as annal's `LogBackend`, against a real three-node JetStream cluster on
//! loopback with TLS and authorization on (`tests/cluster`, Debian's `nats-server`).
//! Everything goes through `&dyn LogBackend`.

mod cluster;

use annal::backend::{BackendError, Expected, LogBackend, Publish, Published, Target};
use annal_codec::SessionId;
use annal_jetstream::JetStreamLog;
use cluster::Cluster;
use std::time::{Duration, Instant};

fn publish(target: Target, payload: &str, expected: Expected, msg_id: Option<&str>) -> Publish {
    Publish { target, payload: payload.as_bytes().to_vec(), expected, msg_id: msg_id.map(Into::into) }
}

fn stored(seq: u64) -> Published {
    Published::Stored { seq, duplicate: false }
}

#[test]
fn the_client_is_a_log_backend_with_expectations_keys_reads_subscriptions_and_a_payload_limit() {
    let cluster = Cluster::start();
    let log = JetStreamLog::connect(&cluster.client_options("BACKEND")).unwrap();
    let backend: &dyn LogBackend = &log;
    let (a, b) = (Target::Session(SessionId([1; 16])), Target::Session(SessionId([2; 16])));
    let wait = Duration::from_secs(10);

    assert_eq!(backend.tip().unwrap(), 0);
    assert_eq!(backend.last_of(&a).unwrap(), None);
    assert_eq!(backend.last_of(&Target::Many).unwrap(), None);
    // Started on the empty stream: it delivers what is appended after it.
    let mut sub = backend.subscribe(1).unwrap();
    assert_eq!(sub.next_within(Duration::from_millis(200)).unwrap(), None);

    let first = backend
        .append(vec![
            publish(a, "a1", Expected::NoMessage, Some("a-1")),
            publish(b, "b1", Expected::NoMessage, None),
            publish(Target::Many, "x1", Expected::Any, Some("x-1")),
        ])
        .unwrap();
    assert_eq!(first, [stored(1), stored(2), stored(3)]);
    // Each expectation names what an earlier call stored: the servers check it against
    // the messages they have applied, not those still in flight in the same batch.
    let second = backend
        .append(vec![
            publish(a, "stale", Expected::NoMessage, None),
            publish(a, "a2", Expected::Last(1), None),
            publish(b, "stale", Expected::Last(1), None),
            publish(b, "b2", Expected::Any, None),
            publish(Target::Many, "x2", Expected::Last(3), None),
        ])
        .unwrap();
    assert_eq!(second, [Published::Conflict, stored(4), Published::Conflict, stored(5), stored(6)]);
    let stale = backend.append(vec![publish(a, "stale", Expected::Last(1), None)]).unwrap();
    assert_eq!(stale, [Published::Conflict]);

    // A key seen before: not stored again, acknowledged with the first copy's sequence.
    let again = backend
        .append(vec![
            publish(a, "a1", Expected::Any, Some("a-1")),
            publish(Target::Many, "x1", Expected::Any, Some("x-1")),
        ])
        .unwrap();
    assert_eq!(again, [Published::Stored { seq: 1, duplicate: true }, Published::Stored { seq: 3, duplicate: true }]);

    // Conflicts and duplicates stored nothing.
    assert_eq!(backend.tip().unwrap(), 6);
    assert_eq!(backend.last_of(&a).unwrap(), Some(4));
    assert_eq!(backend.last_of(&b).unwrap(), Some(5));
    assert_eq!(backend.last_of(&Target::Many).unwrap(), Some(6));
    assert_eq!(backend.last_of(&Target::Session(SessionId([9; 16]))).unwrap(), None);
    let expected: Vec<(u64, Target, Vec<u8>)> = [(1, a, "a1"), (2, b, "b1"), (3, Target::Many, "x1"), (4, a, "a2")]
        .into_iter()
        .chain([(5, b, "b2"), (6, Target::Many, "x2")])
        .map(|(seq, target, payload)| (seq, target, payload.as_bytes().to_vec()))
        .collect();
    let all: Vec<(u64, Target, Vec<u8>)> =
        backend.read(1, 100).unwrap().into_iter().map(|m| (m.seq, m.target, m.payload)).collect();
    assert_eq!(all, expected);
    let middle = backend.read(2, 2).unwrap();
    assert_eq!(middle.iter().map(|m| (m.seq, m.target)).collect::<Vec<_>>(), [(2, b), (3, Target::Many)]);
    // Past the tip: nothing, at once (not after the client's timeout).
    let started = Instant::now();
    assert!(backend.read(7, 10).unwrap().is_empty());
    assert!(started.elapsed() < Duration::from_secs(5), "{:?} to read past the tip", started.elapsed());

    // The subscription delivers every message in order, and nothing more.
    let delivered: Vec<(u64, Target, Vec<u8>)> = (0..6)
        .map(|_| {
            let m = sub.next_within(wait).unwrap().expect("a message within the wait");
            (m.seq, m.target, m.payload)
        })
        .collect();
    assert_eq!(delivered, expected);
    assert_eq!(sub.next_within(Duration::from_millis(300)).unwrap(), None);
    // One started later, from the middle, sees the same messages from there.
    let mut later = backend.subscribe(5).unwrap();
    assert_eq!(later.next_within(wait).unwrap().unwrap().seq, 5);
    assert_eq!(later.next_within(wait).unwrap().unwrap().seq, 6);

    // A payload of exactly the limit is stored, with an expectation and a 64-byte key.
    let max = backend.max_payload();
    assert!(max > 0 && max < log.max_payload() as u64, "{max} leaves room for headers");
    let key = "k".repeat(64);
    let sized = |len: u64, id: &str| Publish {
        target: a,
        payload: vec![7; len as usize],
        expected: Expected::Last(4),
        msg_id: Some(id.into()),
    };
    assert_eq!(backend.append(vec![sized(max, &key)]).unwrap(), [stored(7)]);
    let m = sub.next_within(wait).unwrap().unwrap();
    assert_eq!((m.seq, m.target, m.payload.len() as u64), (7, a, max));
    assert_eq!(later.next_within(wait).unwrap().unwrap().seq, 7);
    // One byte more is refused before anything of its batch is sent.
    let small = publish(b, "small", Expected::Any, None);
    let over = Publish { expected: Expected::Last(7), ..sized(max + 1, "over") };
    assert_eq!(backend.append(vec![small, over]), Err(BackendError::TooLarge { size: max + 1, max }));
    assert_eq!(backend.tip().unwrap(), 7);
    assert_eq!(sub.next_within(Duration::from_millis(300)).unwrap(), None);
}
