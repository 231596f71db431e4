//! Decoding arbitrary bytes never panics and never reads past the limit.

use annal_codec::*;
use proptest::prelude::*;

fn valid_record() -> Vec<u8> {
    let chain = LogChain::plain();
    let rec = Record {
        seq: 1,
        session: SessionId([3; 16]),
        stream_seq: 1,
        committed_at_ms: 5,
        event: Event::TurnCommitted(TurnCommitted {
            turn_id: "t".into(),
            commit_hash: turn_commit_hash(&[], &[], &[], &[]),
            messages: vec![content_id(b"x")],
            usage: vec![],
            applied_context: vec!["k".into()],
            tool_ops: vec![],
            run_id: None,
            revision_after: RevisionId::of(&[content_id(b"x")]),
            state: StateDelta {
                set: std::collections::BTreeMap::from([("tool".into(), content_id(b"state"))]),
                remove: Default::default(),
            },
            inputs: vec![],
        }),
    };
    encode_record(&rec, &chain.genesis(), &chain, 1 << 20).unwrap().0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_record(&bytes, 1 << 16);
        let _ = decode_message(&bytes, 1 << 16);
    }

    #[test]
    fn mutated_records_never_panic(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = valid_record();
        for (pos, val) in edits {
            let i = pos % bytes.len();
            bytes[i] = val;
        }
        let _ = decode_record(&bytes, 1 << 16);
        let chain = LogChain::plain();
        let _ = verify_chain(&bytes, &chain.genesis(), &chain, 1);
    }

    #[test]
    fn any_single_flip_is_caught_by_decode_or_chain(pos in any::<usize>(), bit in 0u8..8) {
        let original = valid_record();
        let mut bytes = original.clone();
        let i = pos % bytes.len();
        bytes[i] ^= 1 << bit;
        let chain = LogChain::plain();
        prop_assert_ne!(&bytes, &original);
        prop_assert!(verify_chain(&bytes, &chain.genesis(), &chain, 1).is_err());
    }
}

/// A turn of `n` messages with some of every other field, for the decoders to agree on.
fn turn(turn_id: String, n: usize, usage: bool, context: Vec<String>, run: Option<String>) -> TurnCommitted {
    let messages: Vec<ContentId> = (0..n).map(|i| content_id(&i.to_le_bytes())).collect();
    TurnCommitted {
        turn_id,
        commit_hash: turn_commit_hash(&messages, &[], &[], &[]),
        revision_after: RevisionId::of(&messages),
        messages,
        usage: if usage {
            vec![Usage {
                provider: "p".into(),
                model: "m".into(),
                input: 300,
                output: 70_000,
                cache_read: 0,
                cache_write: 1,
            }]
        } else {
            vec![]
        },
        applied_context: context,
        tool_ops: vec!["op".into()],
        run_id: run,
        state: StateDelta {
            set: std::collections::BTreeMap::from([("tool".into(), content_id(b"state"))]),
            remove: ["gone".to_string()].into(),
        },
        inputs: vec!["input-1".into()],
    }
}

/// Damages `bytes`: some bytes changed, then cut short, then lengthened.
fn damage(mut bytes: Vec<u8>, edits: Vec<(usize, u8)>, cut: Option<usize>, extra: Vec<u8>) -> Vec<u8> {
    for (pos, byte) in edits {
        if !bytes.is_empty() {
            let len = bytes.len();
            bytes[pos % len] = byte;
        }
    }
    if let Some(cut) = cut {
        bytes.truncate(cut % (bytes.len() + 1));
    }
    bytes.extend(extra);
    bytes
}

/// Holds a decoder that copies ids whole to the plain decoder: the same value from the
/// whole encoding of `value`, and the same answer (accepted with the same value, or
/// refused) for `damaged`, under `limit`.
fn agree<T>(
    value: T,
    damaged: impl FnOnce(Vec<u8>) -> Vec<u8>,
    limit: u64,
    fast: fn(&[u8], u64) -> Result<T, wire::WireError>,
) -> Result<(), TestCaseError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = wire::to_bytes(&value, u64::MAX).unwrap();
    prop_assert_eq!(fast(&bytes, u64::MAX), Ok(value));
    let bytes = damaged(bytes);
    let plain = wire::from_bytes::<T>(&bytes, limit);
    let quick = fast(&bytes, limit);
    prop_assert_eq!(plain.is_ok(), quick.is_ok(), "plain {:?}, fast {:?}", plain, quick);
    if let (Ok(plain), Ok(quick)) = (plain, quick) {
        prop_assert_eq!(plain, quick);
    }
    Ok(())
}

fn ids(n: usize) -> Vec<ContentId> {
    (0..n).map(|i| content_id(&i.to_le_bytes())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The decoders that copy message ids whole (a turn's, a session's creation, a
    /// rewrite's) accept exactly the bytes the plain decoder accepts, and give the same
    /// value: for whole encodings, and for encodings cut short, lengthened, or with
    /// bytes changed (a count or a length among them), under any limit.
    #[test]
    fn the_id_copying_decoders_agree_with_the_plain_decoder(
        id in "[a-z0-9-]{0,40}",
        n in 0usize..300,
        usage in any::<bool>(),
        context in proptest::collection::vec("[a-z]{0,8}", 0..3),
        run in proptest::option::of("[a-z]{0,8}"),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<usize>()),
        extra in proptest::collection::vec(any::<u8>(), 0..3),
        limit in prop_oneof![Just(u64::MAX), 0u64..20_000],
        which in 0u8..3,
    ) {
        let damaged = |bytes| damage(bytes, edits, cut, extra);
        match which {
            0 => agree(turn(id, n, usage, context, run), damaged, limit, TurnCommitted::from_bytes)?,
            1 => {
                let created = SessionCreated {
                    labels: context.into_iter().map(|k| (k, id.clone())).collect(),
                    metadata: id.clone().into_bytes(),
                    forked_from: run.map(|_| ForkOrigin {
                        session: SessionId([4; 16]),
                        revision: RevisionId::of(&ids(2)),
                        message_count: 2,
                    }),
                    messages: ids(n),
                    revision_after: RevisionId::of(&ids(n)),
                };
                agree(created, damaged, limit, SessionCreated::from_bytes)?
            }
            _ => {
                let rewritten = TranscriptRewritten {
                    parent_revision: RevisionId::of(&ids(1)),
                    start: 1,
                    end: 70_000,
                    replacement: ids(n),
                    kind: if usage { RewriteKind::Restore { target: RevisionId::of(&ids(3)) } } else { RewriteKind::Compaction },
                    note: id,
                    actor: run.unwrap_or_default(),
                    revision_after: RevisionId::of(&ids(n)),
                };
                agree(rewritten, damaged, limit, TranscriptRewritten::from_bytes)?
            }
        }
    }
}
