//! Decoding allocates for what it reads, never for what the input claims: a list whose
//! count claims a million elements, followed by nothing, is refused after a small
//! allocation, not a megabyte.
//!
//! The test binary counts the bytes each thread holds allocated, and its peak.

use annal_codec::wire::{self, SEQ_PREALLOC_BYTES};
use annal_codec::*;
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting this thread's live bytes and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to `System` unchanged; the counters are plain
// thread-local cells that allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|live| {
            live.set(live.get() + layout.size());
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
        });
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(layout.size())));
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most bytes `f` held allocated at once beyond what was live before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let out = f();
    (out, PEAK.with(Cell::get) - before)
}

/// The decode limit of the fuzz target.
const LIMIT: u64 = 64 << 10;

/// `empty` (a value's encoding with one list empty) cut after the list's count, with the
/// count claiming a million elements; `one` is the same value with one element in that
/// list, which locates the count: the first byte where the two differ.
fn claiming_a_million(empty: &[u8], one: &[u8]) -> Vec<u8> {
    let at = empty.iter().zip(one).position(|(a, b)| a != b).expect("the encodings differ");
    let mut bytes = empty[..at].to_vec();
    // bincode's varint: 252, then the count as a little-endian u32.
    bytes.push(252);
    bytes.extend_from_slice(&1_000_000u32.to_le_bytes());
    bytes
}

fn id(n: u8) -> ContentId {
    ContentId([n; 32])
}

fn usage() -> Usage {
    Usage { provider: "p".into(), model: "m".into(), input: 1, output: 2, cache_read: 3, cache_write: 4 }
}

fn turn() -> TurnCommitted {
    TurnCommitted {
        turn_id: "t".into(),
        commit_hash: turn_commit_hash(&[], &[], &[], &[]),
        messages: vec![],
        usage: vec![],
        applied_context: vec![],
        tool_ops: vec![],
        run_id: None,
        revision_after: RevisionId::of(&[]),
        state: StateDelta::default(),
        inputs: vec![],
    }
}

fn turn_v2(t: &TurnCommitted) -> TurnCommittedV2 {
    TurnCommittedV2 {
        turn_id: t.turn_id.clone(),
        commit_hash: t.commit_hash,
        messages: t.messages.clone(),
        usage: t.usage.clone(),
        applied_context: t.applied_context.clone(),
        tool_ops: t.tool_ops.clone(),
        run_id: t.run_id.clone(),
        revision_after: t.revision_after,
        state: t.state.clone(),
    }
}

fn turn_v1(t: &TurnCommitted) -> TurnCommittedV1 {
    TurnCommittedV1 {
        turn_id: t.turn_id.clone(),
        commit_hash: t.commit_hash,
        messages: t.messages.clone(),
        usage: t.usage.clone(),
        applied_context: t.applied_context.clone(),
        tool_ops: t.tool_ops.clone(),
        run_id: t.run_id.clone(),
        revision_after: t.revision_after,
    }
}

/// A payload with a list: (a name, the kind, the schema version, the payload with the
/// list empty, the same with one element in it).
type Payload = (String, EventKind, u16, Vec<u8>, Vec<u8>);

/// Adds an element to one of a turn's lists.
type AddTo = fn(&mut TurnCommitted);

/// Every list of a record's payload, in every schema version that has it.
fn payloads() -> Vec<Payload> {
    let enc = |v: &dyn erased::Encode| v.encode();
    let lists: [(&str, AddTo); 5] = [
        ("messages", |t| t.messages.push(id(1))),
        ("usage", |t| t.usage.push(usage())),
        ("applied_context", |t| t.applied_context.push("k".into())),
        ("tool_ops", |t| t.tool_ops.push("op".into())),
        ("inputs", |t| t.inputs.push("in".into())),
    ];
    let mut out = Vec::new();
    for (name, add) in lists {
        let empty = turn();
        let mut one = turn();
        add(&mut one);
        let kind = EventKind::TurnCommitted;
        out.push((format!("turn v3 {name}"), kind, 3, enc(&empty), enc(&one)));
        if name != "inputs" {
            out.push((format!("turn v2 {name}"), kind, 2, enc(&turn_v2(&empty)), enc(&turn_v2(&one))));
            out.push((format!("turn v1 {name}"), kind, 1, enc(&turn_v1(&empty)), enc(&turn_v1(&one))));
        }
    }
    let created = |messages| SessionCreated {
        labels: Default::default(),
        metadata: vec![],
        forked_from: None,
        messages,
        revision_after: RevisionId::of(&[]),
    };
    out.push((
        "created messages".into(),
        EventKind::SessionCreated,
        EventKind::SessionCreated.current_version(),
        enc(&created(vec![])),
        enc(&created(vec![id(1)])),
    ));
    let rewrite = |replacement| TranscriptRewritten {
        parent_revision: RevisionId::of(&[]),
        start: 0,
        end: 0,
        replacement,
        kind: RewriteKind::Edit,
        note: String::new(),
        actor: String::new(),
        revision_after: RevisionId::of(&[]),
    };
    out.push((
        "rewrite replacement".into(),
        EventKind::TranscriptRewritten,
        EventKind::TranscriptRewritten.current_version(),
        enc(&rewrite(vec![])),
        enc(&rewrite(vec![id(1)])),
    ));
    let claim =
        |inputs| InputsClaimed { owner: "w".into(), token: 1, target: ClaimTarget::NextTurn, inputs, expires_at_ms: 9 };
    out.push((
        "claim inputs".into(),
        EventKind::InputsClaimed,
        EventKind::InputsClaimed.current_version(),
        enc(&claim(vec![])),
        enc(&claim(vec!["in".into()])),
    ));
    out
}

/// Encoding through one function for the payload types above.
mod erased {
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            annal_codec::wire::to_bytes(self, super::LIMIT).expect("a small value encodes")
        }
    }
}

/// Room for the decoder's own buffers and the elements it reads before the input ends.
const SMALL: usize = 4 * SEQ_PREALLOC_BYTES;

#[test]
fn a_claimed_list_allocates_what_is_read_not_what_is_claimed() {
    for (name, kind, version, empty, one) in payloads() {
        // Both encodings are what the decoder reads as this kind and version.
        assert!(decode_payload(kind, version, &empty, LIMIT).is_ok(), "{name}: the empty list decodes");
        assert!(decode_payload(kind, version, &one, LIMIT).is_ok(), "{name}: one element decodes");
        let claim = claiming_a_million(&empty, &one);
        let (decoded, peak) = peak_of(|| decode_payload(kind, version, &claim, LIMIT));
        assert!(decoded.is_err(), "{name}: a claim past the input is refused");
        assert!(peak <= SMALL, "{name}: {peak} bytes allocated for a {}-byte input", claim.len());
    }
}

#[test]
fn a_message_claiming_attachments_allocates_what_is_read() {
    let message = |attachments| MessageObject {
        role: Role::User,
        content_type: "text/plain".into(),
        body: b"hello".to_vec(),
        attachments,
    };
    let empty = encode_message(&message(vec![]), LIMIT).unwrap();
    let one = encode_message(&message(vec![id(1)]), LIMIT).unwrap();
    let claim = claiming_a_million(&empty, &one);
    let (decoded, peak) = peak_of(|| decode_message(&claim, LIMIT));
    assert!(decoded.is_err());
    assert!(peak <= SMALL, "decode_message: {peak} bytes");
    let (listed, peak) = peak_of(|| message_attachments(&claim, LIMIT));
    assert!(listed.is_err());
    assert!(peak <= SMALL, "message_attachments: {peak} bytes");
}

#[test]
fn a_list_decodes_as_serde_decodes_it() {
    // The adapter accepts and refuses what serde's own `Vec` does, with the same values.
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Capped(#[serde(deserialize_with = "wire::seq::deserialize")] Vec<String>);
    for value in [vec![], vec!["a".to_string()], (0..500).map(|i| i.to_string()).collect()] {
        let bytes = wire::to_bytes(&value, LIMIT).unwrap();
        assert_eq!(
            wire::from_bytes::<Capped>(&bytes, LIMIT).map(|c| c.0),
            wire::from_bytes::<Vec<String>>(&bytes, LIMIT)
        );
        for cut in [0, 1, bytes.len() / 2] {
            if cut < bytes.len() {
                let short = &bytes[..cut];
                assert_eq!(
                    wire::from_bytes::<Capped>(short, LIMIT).map(|c| c.0),
                    wire::from_bytes::<Vec<String>>(short, LIMIT)
                );
            }
        }
    }
}

/// What the decoders hold at once follows the bytes they read (a few dozen bytes of
/// memory for each byte of a list of short strings, at worst), never a claimed count.
fn allocation_bound(len: usize) -> usize {
    SMALL + 96 * len
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes, as a record, a message object and every payload of every kind
    /// and schema version (a list added to any of them is covered).
    #[test]
    fn arbitrary_bytes_allocate_in_proportion_to_their_length(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let bound = allocation_bound(bytes.len());
        let (_, peak) = peak_of(|| decode_record(&bytes, LIMIT));
        prop_assert!(peak <= bound, "decode_record: {} bytes for {} bytes", peak, bytes.len());
        let (_, peak) = peak_of(|| decode_message(&bytes, LIMIT));
        prop_assert!(peak <= bound, "decode_message: {} bytes for {} bytes", peak, bytes.len());
        for kind in EventKind::ALL {
            for version in kind.oldest_version()..=kind.current_version() {
                let (_, peak) = peak_of(|| decode_payload(kind, version, &bytes, LIMIT));
                prop_assert!(peak <= bound, "{:?} v{}: {} bytes for {} bytes", kind, version, peak, bytes.len());
            }
        }
    }

    /// A valid payload with a large count written at any place, and cut anywhere after
    /// it: wherever the count lands (a list's, a string's, a field's), the decoder holds
    /// what it read.
    #[test]
    fn a_count_written_anywhere_allocates_what_is_read(
        which in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        count in 1u32 << 12..,
        keep in any::<prop::sample::Index>(),
    ) {
        let payloads = payloads();
        let (name, kind, version, _, one) = &payloads[which.index(payloads.len())];
        let at = at.index(one.len());
        let mut bytes = one[..at].to_vec();
        bytes.push(252);
        bytes.extend_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&one[at..][..keep.index(one.len() - at + 1)]);
        let (_, peak) = peak_of(|| decode_payload(*kind, *version, &bytes, LIMIT));
        prop_assert!(peak <= allocation_bound(bytes.len()), "{}: {} bytes for {} bytes", name, peak, bytes.len());
    }
}
