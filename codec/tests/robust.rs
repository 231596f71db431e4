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
