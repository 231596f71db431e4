//! Arbitrary bytes into the record decoder, the message decoder, the chain check and the
//! content decoders (a content row's entries, and the bytes as one lz4 object and as one
//! zstd object), under a small limit. None of them may panic, allocate past the limit (run with
//! `-malloc_limit_mb`), or loop. A record that decodes re-encodes to a record that decodes
//! to the same value, a message that decodes re-encodes to bytes that decode to it, and
//! an object that decompresses is at most the limit long and recompresses to bytes that
//! decompress to it. The bytes also go, sealed with a valid MAC (so that they get past
//! it), into a shared log's message decoder (`annal::shared::decode_message`): what
//! decodes re-encodes to a message that decodes to the same records, objects and guards.

#![no_main]

use annal_codec::{
    content, decode_header, decode_message, decode_record, encode_message, encode_record, verify_chain, LogChain,
};
use libfuzzer_sys::fuzz_target;

/// The decode limit: far below the fuzzer's malloc limit.
const LIMIT: u64 = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let plain = LogChain::plain();
    let keyed = LogChain::keyed([7; 32]);
    let _ = decode_header(data, LIMIT);
    if let Ok(decoded) = decode_record(data, LIMIT) {
        assert!(data.len() as u64 <= LIMIT);
        let prev = plain.genesis();
        let (bytes, hash) =
            encode_record(&decoded.record, &prev, &plain, LIMIT + 64).expect("a decoded record encodes");
        let again = decode_record(&bytes, LIMIT + 64).expect("a re-encoded record decodes");
        assert_eq!(again.record, decoded.record, "decode(encode(r)) == r");
        assert_eq!(verify_chain(&bytes, &prev, &plain, 1), Ok(hash), "a fresh seal verifies");
    }
    for chain in [&plain, &keyed] {
        if let Ok(hash) = verify_chain(data, &chain.genesis(), chain, 1) {
            assert_eq!(annal_codec::stored_chain_hash(data), Some(hash));
        }
    }
    if let Ok(message) = decode_message(data, LIMIT) {
        let bytes = encode_message(&message, LIMIT).expect("a decoded message encodes within its limit");
        assert_eq!(decode_message(&bytes, LIMIT).as_ref(), Ok(&message), "decode(encode(m)) == m");
    }
    // The bytes as the body of a shared log's message, sealed under each chain.
    for chain in [&plain, &keyed] {
        let mut sealed = data.to_vec();
        sealed.extend_from_slice(&chain.next(&annal_codec::ChainHash([0; 32]), data).0);
        if let Ok(m) = annal::shared::decode_message(&sealed, chain, LIMIT, LIMIT) {
            let entries: Vec<_> = m
                .records
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    // Every object rides with the first record, raw.
                    let mut row = Vec::new();
                    if i == 0 {
                        for (id, bytes) in &m.objects {
                            content::push_entry(&mut row, id, bytes);
                        }
                    }
                    (r.clone(), row)
                })
                .collect();
            if let Ok(bytes) = annal::shared::encode_guarded_message(&entries, &m.guards, chain, LIMIT + 64) {
                let again =
                    annal::shared::decode_message(&bytes, chain, LIMIT + 64, LIMIT).expect("re-encoded decodes");
                let zeroed: Vec<_> = m
                    .records
                    .iter()
                    .cloned()
                    .map(|mut r| {
                        r.seq = 0;
                        r
                    })
                    .collect();
                assert_eq!(again.records, zeroed, "decode(encode(m)) keeps the records (at seq 0)");
                assert_eq!(again.guards, m.guards, "and the guards");
                if !m.records.is_empty() {
                    assert_eq!(again.objects, m.objects, "and the objects");
                }
            }
        }
    }
    // The bytes as a content row: every entry's canonical bytes, which hash or not.
    for entry in content::entries(data, LIMIT) {
        let Ok(entry) = entry else { break };
        if let Ok(bytes) = entry.canonical(LIMIT) {
            assert!(bytes.len() as u64 <= LIMIT);
        }
        let _ = entry.verify(LIMIT);
    }
    // The bytes as one stored lz4 object (a canonical length, then a block), and as one
    // stored zstd object (a canonical length, then a frame).
    for encoding in [content::ENCODING_LZ4, content::ENCODING_ZSTD] {
        if let Ok(canonical) = content::decode_object(encoding, data, LIMIT) {
            assert!(canonical.len() as u64 <= LIMIT);
            for compression in [content::Compression::Lz4, content::Compression::Zstd] {
                let (encoding, stored) = content::encode_object_as(&canonical, compression);
                let again = content::decode_object(encoding, &stored, LIMIT).expect("a recompressed object decodes");
                assert_eq!(again.as_ref(), canonical.as_ref(), "decompress(compress(x)) == x");
            }
        }
    }
});
