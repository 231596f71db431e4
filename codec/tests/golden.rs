//! Golden byte vectors: one encoded record of every event kind, checked in. An
//! accidental change to the wire format fails here. Regenerate deliberately with
//! `ANNAL_BLESS=1 cargo test -p annal-codec --test golden` and bump the format.
//! `golden/record-v1/` holds the same records as record format 1 wrote them (never
//! blessed again): they must still decode, verify and re-encode byte for byte.

use annal_codec::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

const LIMIT: u64 = 1 << 20;

fn cid(s: &str) -> ContentId {
    content_id(s.as_bytes())
}

fn examples() -> Vec<Event> {
    let rev = RevisionId::of(&[cid("m1")]);
    let usage = Usage {
        provider: "anthropic".into(),
        model: "claude".into(),
        input: 1200,
        output: 345,
        cache_read: 1000,
        cache_write: 0,
    };
    vec![
        Event::SessionCreated(SessionCreated {
            labels: BTreeMap::from([("project".into(), "annal".into())]),
            metadata: b"{\"v\":1}".to_vec(),
            forked_from: Some(ForkOrigin { session: SessionId([9; 16]), revision: rev, message_count: 1 }),
            messages: vec![cid("m2")],
            revision_after: RevisionId::of(&[cid("m1"), cid("m2")]),
        }),
        Event::TurnCommitted(TurnCommitted {
            turn_id: "turn-1".into(),
            commit_hash: turn_commit_hash_with_inputs(
                &[cid("m3")],
                std::slice::from_ref(&usage),
                &["ctx".into()],
                &["op-1".into()],
                &state(),
                &["in-1".into()],
            ),
            messages: vec![cid("m3")],
            usage: vec![usage],
            applied_context: vec!["ctx".into()],
            tool_ops: vec!["op-1".into()],
            run_id: Some("run-7".into()),
            revision_after: rev.extend(&cid("m3")),
            state: state(),
            inputs: vec!["in-1".into()],
        }),
        Event::TranscriptRewritten(TranscriptRewritten {
            parent_revision: rev,
            start: 0,
            end: 1,
            replacement: vec![cid("summary")],
            kind: RewriteKind::Restore { target: RevisionId::empty() },
            note: "compact".into(),
            actor: "host".into(),
            revision_after: RevisionId::of(&[cid("summary")]),
        }),
        Event::SessionArchived(SessionArchived { reason: "done".into() }),
        Event::SessionRevived(SessionRevived { reason: "again".into() }),
        Event::ContextAppended(ContextAppended { key: "k".into(), content: cid("ctx"), source: "memory".into() }),
        Event::ToolCallRecorded(ToolCallRecorded {
            op_id: "op-1".into(),
            call_id: "toolu_1".into(),
            tool_name: "bash".into(),
            args: cid("{\"cmd\":\"ls\"}"),
            parent_op: Some("op-0".into()),
            turn_id: Some("turn-1".into()),
            recovery: Recovery::NotReplaySafe,
        }),
        Event::ToolResultRecorded(ToolResultRecorded {
            op_id: "op-1".into(),
            outcome: ToolOutcome::Error,
            result: cid("boom"),
        }),
        Event::LabelsChanged(LabelsChanged {
            set: BTreeMap::from([("a".into(), "1".into())]),
            remove: BTreeSet::from(["b".into()]),
        }),
        Event::MetadataSet(MetadataSet { metadata: b"{\"v\":2}".to_vec() }),
        Event::HostStateChanged(HostStateChanged { state: state() }),
        Event::LeaseAcquired(LeaseAcquired { owner: "worker-3".into(), token: 7, expires_at_ms: 1_767_225_630_000 }),
        Event::LeaseReleased(LeaseReleased { token: 7 }),
        Event::InputEnqueued(InputEnqueued {
            input_id: "in-1".into(),
            message: cid("stop, use the other file"),
            kind: InputKind::ActiveTurn,
        }),
        Event::InputsClaimed(InputsClaimed {
            owner: "worker-3".into(),
            token: 7,
            target: ClaimTarget::Turn("turn-9".into()),
            inputs: vec!["in-1".into(), "in-2".into()],
            expires_at_ms: 1_767_225_640_000,
        }),
        Event::ClaimAbandoned(ClaimAbandoned { claim: 15 }),
        Event::InputCancelled(InputCancelled { input_id: "in-3".into() }),
        Event::SessionPurged(SessionPurged {
            reason: "gdpr-art17".into(),
            actor: "dpo@example.com".into(),
            with_ancestor: Some(SessionId([9; 16])),
        }),
    ]
}

fn state() -> StateDelta {
    StateDelta {
        set: BTreeMap::from([("model".into(), cid("{\"name\":\"m1\"}")), ("plugin.fs".into(), cid("cwd=/src"))]),
        remove: BTreeSet::from(["scratch".into()]),
    }
}

fn record(i: u64, event: Event) -> Record {
    Record {
        seq: i + 1,
        session: SessionId([0x42; 16]),
        stream_seq: i + 1,
        committed_at_ms: 1_767_225_600_000 + i,
        event,
    }
}

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

fn check(name: &str, bytes: &[u8]) {
    let path = golden_path(name);
    if std::env::var_os("ANNAL_BLESS").is_some() {
        std::fs::write(&path, bytes).unwrap();
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| panic!("missing golden vector {}: {e}", path.display()));
    assert_eq!(bytes, &expected[..], "wire format of {name} changed");
}

#[test]
fn every_kind_encodes_to_its_golden_vector_and_back() {
    let chain = LogChain::plain();
    let mut prev = chain.genesis();
    let events = examples();
    assert_eq!(events.len(), EventKind::ALL.len(), "one example per kind");
    for (i, event) in events.into_iter().enumerate() {
        let kind = event.kind();
        let rec = record(i as u64, event);
        let (bytes, h) = encode_record(&rec, &prev, &chain, LIMIT).unwrap();
        check(&format!("{}.bin", kind.name()), &bytes);
        let decoded = decode_record(&bytes, LIMIT).unwrap();
        assert_eq!(decoded.record, rec);
        assert_eq!(decoded.chain_hash, h);
        assert_eq!(verify_chain(&bytes, &prev, &chain, rec.seq).unwrap(), h);
        prev = h;
    }
}

#[test]
fn message_object_golden_vector() {
    let m = MessageObject {
        role: Role::Assistant,
        content_type: "application/json".into(),
        body: b"{\"text\":\"hi\"}".to_vec(),
        attachments: vec![cid("png")],
    };
    let bytes = encode_message(&m, LIMIT).unwrap();
    check("MessageObject.bin", &bytes);
    assert_eq!(decode_message(&bytes, LIMIT).unwrap(), m);
}

/// A content row with one raw object and one lz4 object: the layout of rows and the
/// compressed encoding (a change to either, or to how lz4 blocks are written, fails here).
#[test]
fn content_row_golden_vector() {
    use annal_codec::content::{encode_object, entries, push_stored, ENCODING_LZ4, ENCODING_RAW};
    let small = b"a short tool result".to_vec();
    let text = b"{\"role\":\"assistant\",\"text\":\"the agent reads the file and writes the diff\"}\n".repeat(8);
    let mut row = Vec::new();
    for object in [&small, &text] {
        let (encoding, stored) = encode_object(object);
        push_stored(&mut row, &annal_codec::content_id(object), encoding, &stored);
    }
    check("ContentRow.bin", &row);
    let parsed: Vec<_> = entries(&row, LIMIT).collect::<Result<_, _>>().unwrap();
    assert_eq!((parsed[0].encoding, parsed[1].encoding), (ENCODING_RAW, ENCODING_LZ4));
    assert_eq!(parsed[0].verify(LIMIT).unwrap().as_ref(), small.as_slice());
    assert_eq!(parsed[1].verify(LIMIT).unwrap().as_ref(), text.as_slice());
}

/// A content row of objects stored under `Compression::Zstd`: a small one raw, one under
/// the zstd threshold in lz4 and a larger one as a zstd frame (a change to the layout, or
/// to the frames this zstd writes, fails here; every reader must keep decoding them).
#[test]
fn zstd_content_row_golden_vector() {
    use annal_codec::content::{
        encode_object_as, entries, push_stored, Compression, ENCODING_LZ4, ENCODING_RAW, ENCODING_ZSTD,
    };
    let small = b"a short tool result".to_vec();
    let text = b"{\"role\":\"assistant\",\"text\":\"the agent reads the file and writes the diff\"}\n".repeat(8);
    let long = b"{\"role\":\"tool\",\"text\":\"line of a file the agent read, with its number\"}\n".repeat(40);
    let mut row = Vec::new();
    for object in [&small, &text, &long] {
        let (encoding, stored) = encode_object_as(object, Compression::Zstd);
        push_stored(&mut row, &annal_codec::content_id(object), encoding, &stored);
    }
    check("ContentRowZstd.bin", &row);
    let parsed: Vec<_> = entries(&row, LIMIT).collect::<Result<_, _>>().unwrap();
    let encodings: Vec<u8> = parsed.iter().map(|e| e.encoding).collect();
    assert_eq!(encodings, [ENCODING_RAW, ENCODING_LZ4, ENCODING_ZSTD]);
    for (entry, object) in parsed.iter().zip([&small, &text, &long]) {
        assert_eq!(entry.verify(LIMIT).unwrap().as_ref(), object.as_slice());
    }
}

/// Builds the v0 fixture: a ContextAppended written before `source` existed.
fn v0_fixture_bytes() -> Vec<u8> {
    let payload = wire::to_bytes(&ContextAppendedV0 { key: "k".into(), content: cid("ctx") }, LIMIT).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION_V1);
    out.push(EventKind::ContextAppended.byte());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    out.extend_from_slice(&[0x42; 16]);
    out.extend_from_slice(&1u64.to_le_bytes());
    out.extend_from_slice(&1_767_225_600_000u64.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    let chain = LogChain::plain();
    let h = chain.next(&chain.genesis(), &out);
    out.extend_from_slice(&h.0);
    out
}

#[test]
fn v0_context_appended_is_upcast() {
    let path = golden_path("ContextAppended.v0.bin");
    if std::env::var_os("ANNAL_BLESS").is_some() {
        std::fs::write(&path, v0_fixture_bytes()).unwrap();
    }
    let bytes = std::fs::read(path).unwrap();
    let decoded = decode_record(&bytes, LIMIT).unwrap();
    assert_eq!(decoded.schema_version, 0);
    assert_eq!(
        decoded.record.event,
        Event::ContextAppended(ContextAppended { key: "k".into(), content: cid("ctx"), source: String::new() })
    );
    let chain = LogChain::plain();
    verify_chain(&bytes, &chain.genesis(), &chain, 1).unwrap();
}

/// A turn written before host state existed (schema 1, checked in from the format it
/// was written in): read as schema 2 with no state change, and its chain still holds.
#[test]
fn v1_turn_committed_is_upcast() {
    let bytes = std::fs::read(golden_path("TurnCommitted.v1.bin")).unwrap();
    let decoded = decode_record(&bytes, LIMIT).unwrap();
    assert_eq!(decoded.schema_version, 1);
    let Event::TurnCommitted(turn) = &decoded.record.event else { panic!("not a turn: {:?}", decoded.record) };
    assert_eq!(turn.state, StateDelta::default());
    assert_eq!(turn.turn_id, "turn-1");
    assert_eq!(turn.commit_hash, turn_commit_hash(&turn.messages, &turn.usage, &turn.applied_context, &turn.tool_ops));
    // It followed the SessionCreated vector in the chain.
    let chain = LogChain::plain();
    let created = std::fs::read(golden_path("record-v1/SessionCreated.bin")).unwrap();
    let prev = verify_chain(&created, &chain.genesis(), &chain, 1).unwrap();
    verify_chain(&bytes, &prev, &chain, 2).unwrap();
}

/// A turn written before queued inputs existed (schema 2, the vector the previous
/// release wrote): read as schema 3 with no inputs, its chain and hash as they were.
#[test]
fn v2_turn_committed_is_upcast() {
    let bytes = std::fs::read(golden_path("TurnCommitted.v2.bin")).unwrap();
    let decoded = decode_record(&bytes, LIMIT).unwrap();
    assert_eq!(decoded.schema_version, 2);
    let Event::TurnCommitted(turn) = &decoded.record.event else { panic!("not a turn: {:?}", decoded.record) };
    assert!(turn.inputs.is_empty());
    assert_eq!(turn.state, state());
    let hash =
        turn_commit_hash_with_state(&turn.messages, &turn.usage, &turn.applied_context, &turn.tool_ops, &turn.state);
    assert_eq!(turn.commit_hash, hash);
    assert_eq!(
        turn_commit_hash_with_inputs(
            &turn.messages,
            &turn.usage,
            &turn.applied_context,
            &turn.tool_ops,
            &turn.state,
            &[]
        ),
        hash,
        "a turn without inputs hashes as before"
    );
    let chain = LogChain::plain();
    let created = std::fs::read(golden_path("record-v1/SessionCreated.bin")).unwrap();
    let prev = verify_chain(&created, &chain.genesis(), &chain, 1).unwrap();
    verify_chain(&bytes, &prev, &chain, 2).unwrap();
}

#[test]
fn newer_schema_version_is_a_typed_error() {
    let chain = LogChain::plain();
    let rec = record(0, examples().remove(3));
    let (mut bytes, _) = encode_record(&rec, &chain.genesis(), &chain, LIMIT).unwrap();
    bytes[6..8].copy_from_slice(&2u16.to_le_bytes());
    assert_eq!(
        decode_record(&bytes, LIMIT),
        Err(DecodeError::UnsupportedVersion { kind: EventKind::SessionArchived, found: 2, supported: 1 })
    );
}

#[test]
fn structural_errors_are_typed() {
    let chain = LogChain::plain();
    let rec = record(0, examples().remove(3));
    let (bytes, _) = encode_record(&rec, &chain.genesis(), &chain, LIMIT).unwrap();
    assert!(matches!(decode_record(&bytes[..10], LIMIT), Err(DecodeError::Truncated { .. })));
    assert!(matches!(decode_record(&bytes[..bytes.len() - 1], LIMIT), Err(DecodeError::Truncated { .. })));
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(decode_record(&longer, LIMIT), Err(DecodeError::TrailingBytes { extra: 1 }));
    let mut bad_kind = bytes.clone();
    bad_kind[5] = 200;
    assert_eq!(decode_record(&bad_kind, LIMIT), Err(DecodeError::UnknownKind { kind: 200 }));
    let mut bad_magic = bytes.clone();
    bad_magic[0] = b'X';
    assert!(matches!(decode_record(&bad_magic, LIMIT), Err(DecodeError::BadMagic { .. })));
    assert!(matches!(decode_record(&bytes, 20), Err(DecodeError::TooLarge { .. })));
    let mut flipped = bytes.clone();
    flipped[HEADER_LEN] ^= 1;
    assert_eq!(verify_chain(&flipped, &chain.genesis(), &chain, 1), Err(DecodeError::ChainMismatch { seq: 1 }));
}

/// Record format 1 (the chain over the payload bytes): every kind it had still decodes to
/// the same event, verifies under its own rule and re-encodes byte for byte; `reseal`
/// turns each into the format-2 vector.
#[test]
fn record_format_1_vectors_decode_verify_and_reseal() {
    let chain = LogChain::plain();
    let (mut prev, mut prev2) = (chain.genesis(), chain.genesis());
    for (i, event) in examples().into_iter().enumerate() {
        let kind = event.kind();
        if kind == EventKind::SessionPurged {
            continue;
        }
        let rec = record(i as u64, event);
        let bytes = std::fs::read(golden_path(&format!("record-v1/{}.bin", kind.name()))).unwrap();
        let decoded = decode_record(&bytes, LIMIT).unwrap();
        assert_eq!((decoded.format, &decoded.record), (FORMAT_VERSION_V1, &rec));
        let h = verify_chain(&bytes, &prev, &chain, rec.seq).unwrap();
        assert_eq!(encode_record_as(&rec, FORMAT_VERSION_V1, &prev, &chain, LIMIT).unwrap(), (bytes.clone(), h));
        assert_eq!(erase_record(&bytes, &chain, LIMIT), Err(DecodeError::UnsupportedFormat { found: 1, supported: 2 }));
        let (resealed, h2) = reseal(&bytes, &prev2, &chain, LIMIT).unwrap();
        assert_eq!(resealed, std::fs::read(golden_path(&format!("{}.bin", kind.name()))).unwrap());
        (prev, prev2) = (h, h2);
    }
}

/// An erased record: the SessionCreated vector with its payload replaced by the payload
/// digest. It keeps the chain hash, so it and the record after it verify as before.
#[test]
fn erased_record_golden_vector() {
    let chain = LogChain::plain();
    let created = std::fs::read(golden_path("SessionCreated.bin")).unwrap();
    let turn = std::fs::read(golden_path("TurnCommitted.bin")).unwrap();
    let erased = erase_record(&created, &chain, LIMIT).unwrap();
    check("Erased.SessionCreated.bin", &erased);
    assert_eq!(erased.len(), ERASED_RECORD_LEN);
    assert_eq!(&erased[..4], &MAGIC_ERASED);
    let h1 = verify_chain(&created, &chain.genesis(), &chain, 1).unwrap();
    assert_eq!(verify_chain(&erased, &chain.genesis(), &chain, 1).unwrap(), h1);
    verify_chain(&turn, &h1, &chain, 2).unwrap();
    let decoded = decode_record(&erased, LIMIT).unwrap();
    let Event::Erased(e) = decoded.record.event else { panic!("not erased: {decoded:?}") };
    let payload_len = created.len() - RECORD_LEN_MIN;
    assert_eq!((e.kind, e.schema_version, e.payload_len as usize), (EventKind::SessionCreated, 1, payload_len));
    assert_eq!(e.payload_digest, chain.payload_digest(&created[HEADER_LEN..HEADER_LEN + payload_len]));
    assert_eq!(decoded.record.seq, 1);
    // Re-encoding what was read gives the erased bytes back; erasing again changes nothing.
    assert_eq!(encode_record(&decoded.record, &chain.genesis(), &chain, LIMIT).unwrap(), (erased.clone(), h1));
    assert_eq!(erase_record(&erased, &chain, LIMIT).unwrap(), erased);
    // A flipped byte of the header or of the digest breaks the link; a longer one is refused.
    for at in [5, 20, HEADER_LEN + 3] {
        let mut bad = erased.clone();
        bad[at] ^= 1;
        assert!(verify_chain(&bad, &chain.genesis(), &chain, 1).is_err(), "byte {at}");
    }
    let mut longer = erased.clone();
    longer.push(0);
    assert!(decode_record(&longer, LIMIT).is_err());
    assert!(verify_chain(&longer, &chain.genesis(), &chain, 1).is_err());
    // Under a key the digest is keyed: the same payload gives another digest.
    assert_ne!(LogChain::keyed([3; 32]).payload_digest(b"x"), chain.payload_digest(b"x"));
}
