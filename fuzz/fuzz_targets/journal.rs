//! Arbitrary bytes as the two journal files of a database whose log file is empty. The
//! journal reader (`annal::journal::rows_after`, what an open, a read-only opener and
//! `annal verify` run) never panics, allocates nothing past its input, and every row it
//! returns continues the chain from the genesis, seq after seq. The target writes each
//! frame's magic, a payload length that fits and the checksum itself, so inputs reach
//! the payload parser and the continuity checks instead of stopping at the checksum.

#![no_main]

use annal_codec::{verify_chain, LogChain};
use libfuzzer_sys::fuzz_target;

/// Bytes of a frame's header (see `annal::journal`).
const HEADER: usize = 92;

fuzz_target!(|data: &[u8]| {
    // The first byte says where the first file ends (255: all of it).
    let Some((&first, rest)) = data.split_first() else { return };
    let (a, b) = rest.split_at(usize::from(first) * rest.len() / 255);
    let files = [seal_frames(a), seal_frames(b)];
    for chain in [LogChain::plain(), LogChain::keyed([7; 32])] {
        let Ok(rows) = annal::journal::rows_after(&files, 0, &chain.genesis(), &chain) else { continue };
        let mut prev = chain.genesis();
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.seq, i as u64 + 1, "rows follow each other from seq 1");
            prev = verify_chain(&row.record, &prev, &chain, row.seq).expect("a returned row continues the chain");
        }
    }
});

/// Walks `bytes` as frames and makes each one whole: the magic, a payload length that
/// fits in what is left, and the blake3 checksum over the header and the payload.
fn seal_frames(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let mut at = 0;
    while at + HEADER <= out.len() {
        out[at..at + 4].copy_from_slice(b"ANJ1");
        let room = out.len() - at - HEADER;
        let claimed = u32::from_le_bytes(out[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let len = claimed % (room + 1);
        out[at + 4..at + 8].copy_from_slice(&(len as u32).to_le_bytes());
        let end = at + HEADER + len;
        let mut h = blake3::Hasher::new();
        h.update(&out[at..at + 60]);
        h.update(&out[at + HEADER..end]);
        out[at + 60..at + HEADER].copy_from_slice(h.finalize().as_bytes());
        at = end;
    }
    out
}
