//! Content rows: the bytes of the content objects a record introduced, stored in the
//! `content` table under that record's sequence number, in the same transaction as the
//! record. A row is a concatenation of entries, in the order the record first refers to
//! them (a message object's attachments follow it):
//!
//! ```text
//! offset  size  field
//!  0      32    content id = blake3(canonical bytes)
//! 32       1    encoding: 0 = raw (the stored bytes are the canonical bytes),
//!               1 = lz4, 2 = zstd (below)
//! 33       4    stored length n, u32 little-endian
//! 37       n    stored bytes
//! ```
//!
//! A compressed object's stored bytes are the canonical length (u32 little-endian), then
//! an lz4 block (`lz4_flex::block`, encoding 1) or a zstd frame (encoding 2: a standard
//! frame without its optional content size and checksum). How a writer compresses is a
//! [`Compression`]; an object is stored compressed only when that saves at least an
//! eighth of its size ([`compress_object`]), so small and incompressible objects stay
//! raw. Files may mix every encoding, and every reader decodes all three. The id is
//! always over the canonical bytes.
//!
//! An empty row never exists: a record that introduces nothing has no content row.
//! Parsing checks every length against the row and the configured limit, so it never
//! panics and never allocates more than the row it was given; decompression checks the
//! declared canonical length against the limit before it allocates, and the decompressor
//! never writes past it (a decompression bomb is `TooLarge`, a frame that holds more or
//! fewer bytes than it declares is `BadContent`).

use crate::ids::ContentId;
use crate::record::DecodeError;

/// Bytes before an entry's stored bytes.
pub const ENTRY_HEADER_LEN: usize = 37;

/// Encoding byte of an object stored as its canonical bytes.
pub const ENCODING_RAW: u8 = 0;
/// Encoding byte of an object stored as its canonical length and an lz4 block.
pub const ENCODING_LZ4: u8 = 1;
/// Encoding byte of an object stored as its canonical length and a zstd frame.
pub const ENCODING_ZSTD: u8 = 2;
/// Under [`Compression::Zstd`], objects of at least this many bytes are compressed with
/// zstd and smaller ones with lz4: below it, zstd's work per call (its entropy tables)
/// costs more than it saves over lz4.
pub const ZSTD_BYTES_MIN: usize = 1024;
/// The zstd level of [`Compression::Zstd`].
pub const ZSTD_LEVEL: i32 = 1;

/// How a writer stores the content objects it introduces. Readers decode every
/// encoding whatever the writer's choice, so a file may hold objects of all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Every object raw.
    Off,
    /// lz4 ([`ENCODING_LZ4`]) from [`COMPRESS_BYTES_MIN`] bytes: the fastest both ways.
    /// The default.
    #[default]
    Lz4,
    /// zstd at [`ZSTD_LEVEL`] ([`ENCODING_ZSTD`]) from [`ZSTD_BYTES_MIN`] bytes, lz4
    /// below it: a quarter to a third fewer stored bytes than lz4 (0.38 of the canonical
    /// bytes against 0.51 to 0.55 on the corpora measured), for 1.6 to 2 times the CPU to
    /// compress and 2.5 to 3 times to decompress.
    Zstd,
}

thread_local! {
    /// Each thread's zstd compression context, made at its first object and reused.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> = const { std::cell::RefCell::new(None) };
    /// Each thread's zstd decompression context.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on this thread's zstd context in `slot`, made by `make` at its first use; on
/// a fresh one when the thread's cannot be had (its thread-locals are being torn down),
/// so that no call panics for want of it.
fn with_context<C: 'static, T>(
    slot: &'static std::thread::LocalKey<std::cell::RefCell<Option<C>>>,
    make: impl Fn() -> std::io::Result<C>,
    mut f: impl FnMut(&mut C) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let kept = slot.try_with(|cell| {
        let mut cell = cell.try_borrow_mut().ok()?;
        Some(match cell.as_mut() {
            Some(context) => f(context),
            None => make().and_then(|context| f(cell.insert(context))),
        })
    });
    match kept {
        Ok(Some(result)) => result,
        _ => f(&mut make()?),
    }
}

/// Objects smaller than this are stored raw: compressing them saves too little.
pub const COMPRESS_BYTES_MIN: usize = 128;

/// How an object is stored under the default [`Compression`]: its encoding byte and
/// stored bytes ([`encode_object_as`]).
pub fn encode_object(canonical: &[u8]) -> (u8, Vec<u8>) {
    encode_object_as(canonical, Compression::default())
}

/// How an object is stored under `compression`: compressed when that saves at least an
/// eighth of the canonical size ([`compress_object`]), raw otherwise.
pub fn encode_object_as(canonical: &[u8], compression: Compression) -> (u8, Vec<u8>) {
    compress_object(canonical, compression).unwrap_or_else(|| (ENCODING_RAW, canonical.to_vec()))
}

/// The encoding and stored bytes of `canonical` when [`encode_object_as`] would store it
/// compressed under `compression`; `None` when it stays raw. Objects under
/// [`COMPRESS_BYTES_MIN`] bytes always stay raw. lz4's stored bytes are laid out in one
/// buffer by lz4_flex (the length, then the block); zstd's are the length, then a frame
/// from the thread's compression context, made at its first object and reused.
pub fn compress_object(canonical: &[u8], compression: Compression) -> Option<(u8, Vec<u8>)> {
    if canonical.len() < COMPRESS_BYTES_MIN || canonical.len() > u32::MAX as usize {
        return None;
    }
    let keep = canonical.len() - canonical.len() / 8;
    match compression {
        Compression::Off => None,
        Compression::Zstd if canonical.len() >= ZSTD_BYTES_MIN => {
            let mut stored = vec![0u8; 4 + zstd::zstd_safe::compress_bound(canonical.len())];
            stored[..4].copy_from_slice(&(canonical.len() as u32).to_le_bytes());
            let make = || {
                let mut c = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
                c.set_parameter(zstd::zstd_safe::CParameter::ContentSizeFlag(false))?;
                Ok(c)
            };
            let written =
                with_context(&COMPRESSOR, make, |c| c.compress_to_buffer(canonical, &mut stored[4..])).ok()?;
            (4 + written <= keep).then(|| {
                stored.truncate(4 + written);
                (ENCODING_ZSTD, stored)
            })
        }
        Compression::Lz4 | Compression::Zstd => {
            let stored = lz4_flex::block::compress_prepend_size(canonical);
            (stored.len() <= keep).then_some((ENCODING_LZ4, stored))
        }
    }
}

/// The canonical bytes of a stored object, at most `max` of them.
pub fn decode_object(encoding: u8, stored: &[u8], max: u64) -> Result<std::borrow::Cow<'_, [u8]>, DecodeError> {
    if encoding == ENCODING_RAW {
        return Ok(std::borrow::Cow::Borrowed(stored));
    }
    let mut canonical = Vec::new();
    decode_object_into(encoding, stored, max, &mut canonical)?;
    Ok(std::borrow::Cow::Owned(canonical))
}

/// [`decode_object`] into `buf`, a buffer reused from object to object, instead of a
/// fresh one for each object that is stored compressed: the same bytes and the same
/// errors (an object stored raw is returned from `stored`, and `buf` is left alone).
pub fn decode_object_into<'s: 'o, 'o>(
    encoding: u8,
    stored: &'s [u8],
    max: u64,
    buf: &'o mut Vec<u8>,
) -> Result<&'o [u8], DecodeError> {
    let codec = match encoding {
        ENCODING_RAW => return Ok(stored),
        ENCODING_LZ4 => "lz4",
        ENCODING_ZSTD => "zstd",
        other => return Err(DecodeError::BadContent { detail: format!("unknown content encoding {other}") }),
    };
    // Both compressed encodings: the canonical length, checked before anything is
    // allocated, then the compressed bytes, which must fill exactly that length.
    let Some((len, compressed)) = stored.split_first_chunk::<4>() else {
        return Err(DecodeError::Truncated { needed: 4, found: stored.len() as u64 });
    };
    let len = u32::from_le_bytes(*len) as u64;
    if len > max {
        return Err(DecodeError::TooLarge { size: len, max });
    }
    buf.clear();
    buf.resize(len as usize, 0);
    let written = if encoding == ENCODING_LZ4 {
        lz4_flex::block::decompress_into(compressed, buf).map_err(|e| e.to_string())
    } else {
        with_context(&DECOMPRESSOR, zstd::bulk::Decompressor::new, |d| d.decompress_to_buffer(compressed, &mut buf[..]))
            .map_err(|e| e.to_string())
    }
    .map_err(|e| DecodeError::BadContent { detail: format!("{codec}: {e}") })?;
    if written as u64 != len {
        return Err(DecodeError::BadContent { detail: format!("{codec}: {written} bytes, declared {len}") });
    }
    Ok(&buf[..])
}

/// One object of a content row, borrowed from the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentEntry<'a> {
    /// The id stored with the object (checked against the bytes by [`ContentEntry::verify`]).
    pub id: ContentId,
    /// The encoding byte.
    pub encoding: u8,
    /// The stored bytes.
    pub stored: &'a [u8],
}

impl<'a> ContentEntry<'a> {
    /// The canonical bytes (decompressed, at most `max`), unchecked.
    pub fn canonical(&self, max: u64) -> Result<std::borrow::Cow<'a, [u8]>, DecodeError> {
        decode_object(self.encoding, self.stored, max)
    }

    /// [`ContentEntry::verify`] decompressing into `buf`, a buffer reused from entry to
    /// entry ([`decode_object_into`]).
    pub fn verify_into<'b>(&self, max: u64, buf: &'b mut Vec<u8>) -> Option<&'b [u8]>
    where
        'a: 'b,
    {
        decode_object_into(self.encoding, self.stored, max, buf)
            .ok()
            .filter(|bytes| crate::content_id(bytes) == self.id)
    }

    /// The canonical bytes, if they decode (at most `max` of them) and hash to the
    /// stored id.
    pub fn verify(&self, max: u64) -> Option<std::borrow::Cow<'a, [u8]>> {
        self.canonical(max).ok().filter(|bytes| crate::content_id(bytes) == self.id)
    }
}

/// Appends one raw entry to `row`.
pub fn push_entry(row: &mut Vec<u8>, id: &ContentId, bytes: &[u8]) {
    push_stored(row, id, ENCODING_RAW, bytes);
}

/// Appends one entry to `row`, stored as `encoding` (see [`encode_object`]).
pub fn push_stored(row: &mut Vec<u8>, id: &ContentId, encoding: u8, stored: &[u8]) {
    row.reserve(ENTRY_HEADER_LEN + stored.len());
    row.extend_from_slice(&id.0);
    row.push(encoding);
    row.extend_from_slice(&(stored.len() as u32).to_le_bytes());
    row.extend_from_slice(stored);
}

/// Iterates the entries of a content row. Each item is an entry or the structural error
/// that ends the row; `object_bytes_max` bounds each entry's stored length.
pub fn entries(row: &[u8], object_bytes_max: u64) -> Entries<'_> {
    Entries { rest: row, max: object_bytes_max, failed: false }
}

/// Iterator returned by [`entries`].
#[derive(Clone, Debug)]
pub struct Entries<'a> {
    rest: &'a [u8],
    max: u64,
    failed: bool,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<ContentEntry<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() || self.failed {
            return None;
        }
        let result = self.parse_one();
        self.failed = result.is_err();
        Some(result)
    }
}

impl<'a> Entries<'a> {
    fn parse_one(&mut self) -> Result<ContentEntry<'a>, DecodeError> {
        let rest = self.rest;
        if rest.len() < ENTRY_HEADER_LEN {
            return Err(DecodeError::Truncated { needed: ENTRY_HEADER_LEN as u64, found: rest.len() as u64 });
        }
        let mut id = [0u8; 32];
        id.copy_from_slice(&rest[..32]);
        let encoding = rest[32];
        let len = u32::from_le_bytes([rest[33], rest[34], rest[35], rest[36]]) as u64;
        if len > self.max {
            return Err(DecodeError::TooLarge { size: len, max: self.max });
        }
        let body = &rest[ENTRY_HEADER_LEN..];
        if (body.len() as u64) < len {
            return Err(DecodeError::Truncated { needed: len, found: body.len() as u64 });
        }
        let (stored, rest) = body.split_at(len as usize);
        self.rest = rest;
        Ok(ContentEntry { id: ContentId(id), encoding, stored })
    }
}

/// The ids of a content row's entries, read from the row's bytes in as many pieces as
/// they come in (a row stored in pieces need not be joined to list its ids). Feed the
/// pieces in order with [`IdScan::feed`], then [`IdScan::finish`]: the result is that
/// of [`entries`] over the joined row, ids or the first structural error, the same
/// error with the same figures.
#[derive(Clone, Debug)]
pub struct IdScan {
    max: u64,
    /// The header being read, and how much of it has come.
    header: [u8; ENTRY_HEADER_LEN],
    filled: usize,
    /// The entry being skipped: its stored length and the bytes of it still to come.
    len: u64,
    skip: u64,
    ids: Vec<ContentId>,
    error: Option<DecodeError>,
}

impl IdScan {
    /// A scan of one row, each entry's stored length bounded by `object_bytes_max`.
    pub fn new(object_bytes_max: u64) -> IdScan {
        IdScan {
            max: object_bytes_max,
            header: [0; ENTRY_HEADER_LEN],
            filled: 0,
            len: 0,
            skip: 0,
            ids: Vec::new(),
            error: None,
        }
    }

    /// The row's next bytes.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.error.is_none() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len() as u64);
                bytes = &bytes[n as usize..];
                self.skip -= n;
                continue;
            }
            let n = (ENTRY_HEADER_LEN - self.filled).min(bytes.len());
            self.header[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == ENTRY_HEADER_LEN {
                self.filled = 0;
                let h = &self.header;
                let len = u32::from_le_bytes([h[33], h[34], h[35], h[36]]) as u64;
                if len > self.max {
                    self.error = Some(DecodeError::TooLarge { size: len, max: self.max });
                    return;
                }
                let mut id = [0u8; 32];
                id.copy_from_slice(&h[..32]);
                self.ids.push(ContentId(id));
                (self.len, self.skip) = (len, len);
            }
        }
    }

    /// The ids of the row fed, in row order, or what was wrong with it.
    pub fn finish(self) -> Result<Vec<ContentId>, DecodeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.filled > 0 {
            return Err(DecodeError::Truncated { needed: ENTRY_HEADER_LEN as u64, found: self.filled as u64 });
        }
        if self.skip > 0 {
            return Err(DecodeError::Truncated { needed: self.len, found: self.len - self.skip });
        }
        Ok(self.ids)
    }
}

/// The entry with id `id` in `row`, if the row holds it.
pub fn find<'a>(row: &'a [u8], id: &ContentId, object_bytes_max: u64) -> Result<Option<ContentEntry<'a>>, DecodeError> {
    for entry in entries(row, object_bytes_max) {
        let entry = entry?;
        if entry.id == *id {
            return Ok(Some(entry));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_verify() {
        let (a, b) = (b"alpha".as_slice(), b"".as_slice());
        let mut row = Vec::new();
        push_entry(&mut row, &crate::content_id(a), a);
        push_entry(&mut row, &crate::content_id(b), b);
        let parsed: Vec<_> = entries(&row, 1 << 20).collect::<Result<_, _>>().unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].verify(1 << 20).as_deref(), Some(a));
        assert_eq!(parsed[1].verify(1 << 20).as_deref(), Some(b));
        assert_eq!(find(&row, &crate::content_id(b), 1 << 20).unwrap().unwrap().stored, b);
    }

    /// The ids, or the first error, of `entries` over the whole row.
    fn ids_of(row: &[u8], max: u64) -> Result<Vec<ContentId>, DecodeError> {
        entries(row, max).map(|e| e.map(|e| e.id)).collect()
    }

    proptest::proptest! {
        /// A scan fed a row in any pieces gives what `entries` gives over the joined row:
        /// rows of whole entries, cut short, with a byte changed, or arbitrary bytes.
        #[test]
        fn an_id_scan_over_pieces_reads_as_entries_does(
            objects in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..90), 0..5),
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..120),
            damage in 0u8..4,
            at in proptest::num::usize::ANY,
            cuts in proptest::collection::vec(0usize..200, 0..6),
            max in proptest::prop_oneof![proptest::strategy::Just(1u64 << 20), 0u64..80],
        ) {
            let mut row = Vec::new();
            for o in &objects {
                push_entry(&mut row, &crate::content_id(o), o);
            }
            match damage {
                1 if !row.is_empty() => row.truncate(at % row.len()),
                2 if !row.is_empty() => { let i = at % row.len(); row[i] ^= 0x5a; }
                3 => row = junk,
                _ => {}
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(row.len())).collect();
            cuts.sort_unstable();
            let mut scan = IdScan::new(max);
            let mut from = 0;
            for c in cuts.into_iter().chain([row.len()]) {
                scan.feed(&row[from..c]);
                from = c;
            }
            proptest::prop_assert_eq!(scan.finish(), ids_of(&row, max));
        }
    }

    #[test]
    fn damaged_rows_are_typed_errors() {
        let mut row = Vec::new();
        push_entry(&mut row, &crate::content_id(b"x"), b"x");
        for cut in 0..row.len() {
            let parsed: Vec<_> = entries(&row[..cut], 1 << 20).collect();
            assert!(cut == 0 || parsed.last().unwrap().is_err(), "cut {cut}");
        }
        assert!(matches!(entries(&row, 0).next(), Some(Err(DecodeError::TooLarge { .. }))));
        row[ENTRY_HEADER_LEN] ^= 1;
        assert_eq!(entries(&row, 1 << 20).next().unwrap().unwrap().verify(1 << 20), None);
    }

    #[test]
    fn compressed_objects_round_trip_and_small_or_random_ones_stay_raw() {
        let text = b"the agent reads the file and writes the diff ".repeat(40);
        let (encoding, stored) = encode_object(&text);
        assert_eq!(encoding, ENCODING_LZ4);
        assert!(stored.len() < text.len() / 4, "{} of {}", stored.len(), text.len());
        let mut row = Vec::new();
        push_stored(&mut row, &crate::content_id(&text), encoding, &stored);
        let entry = entries(&row, 1 << 20).next().unwrap().unwrap();
        assert_eq!(entry.verify(1 << 20).as_deref(), Some(text.as_slice()));
        assert_eq!(encode_object(b"short").0, ENCODING_RAW);
        let mut noise = vec![0u8; 4096];
        blake3::Hasher::new().update(b"noise").finalize_xof().fill(&mut noise);
        let (encoding, stored) = encode_object(&noise);
        assert_eq!((encoding, stored.as_slice()), (ENCODING_RAW, noise.as_slice()), "incompressible stays raw");
    }

    #[test]
    fn zstd_compresses_large_objects_and_lz4_the_small_ones() {
        let text = b"the agent reads the file, runs the tests and writes the diff\n".repeat(50);
        let (encoding, stored) = encode_object_as(&text, Compression::Zstd);
        assert_eq!(encoding, ENCODING_ZSTD);
        assert!(stored.len() < encode_object(&text).1.len(), "zstd stores less than lz4 here");
        assert_eq!(decode_object(encoding, &stored, 1 << 20).unwrap().as_ref(), text.as_slice());
        let mut row = Vec::new();
        push_stored(&mut row, &crate::content_id(&text), encoding, &stored);
        let entry = entries(&row, 1 << 20).next().unwrap().unwrap();
        assert_eq!(entry.verify(1 << 20).as_deref(), Some(text.as_slice()));
        let small = &text[..ZSTD_BYTES_MIN - 1];
        assert_eq!(encode_object_as(small, Compression::Zstd).0, ENCODING_LZ4, "under the threshold: lz4");
        assert_eq!(encode_object_as(&text, Compression::Lz4).0, ENCODING_LZ4);
        assert_eq!(encode_object_as(&text, Compression::Off), (ENCODING_RAW, text.clone()));
        let mut noise = vec![0u8; 4096];
        blake3::Hasher::new().update(b"noise").finalize_xof().fill(&mut noise);
        assert_eq!(encode_object_as(&noise, Compression::Zstd), (ENCODING_RAW, noise), "incompressible stays raw");
    }

    #[test]
    fn a_context_that_cannot_be_had_is_replaced_by_a_fresh_one() {
        thread_local! {
            static SLOT: std::cell::RefCell<Option<u32>> = const { std::cell::RefCell::new(None) };
        }
        let made = std::cell::Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            Ok(made.get())
        };
        // The first call makes the thread's context; a call made while it is in use gets
        // a fresh one instead of panicking; a later call reuses the thread's.
        let inner = with_context(&SLOT, make, |outer| {
            assert_eq!(*outer, 1);
            with_context(&SLOT, make, |inner| Ok(*inner))
        });
        assert_eq!(inner.unwrap(), 2);
        assert_eq!(with_context(&SLOT, make, |c| Ok(*c)).unwrap(), 1);
        assert_eq!(made.get(), 2);
    }

    #[test]
    fn a_zstd_bomb_or_a_frame_that_lies_fails_closed() {
        let big = vec![0u8; 1 << 20];
        let (encoding, stored) = encode_object_as(&big, Compression::Zstd);
        assert_eq!(encoding, ENCODING_ZSTD);
        assert!(stored.len() < 1 << 10);
        assert_eq!(
            decode_object(encoding, &stored, 1 << 16).unwrap_err(),
            DecodeError::TooLarge { size: 1 << 20, max: 1 << 16 }
        );
        // A frame that holds more than its declared length never writes past it.
        let mut short = stored.clone();
        short[..4].copy_from_slice(&(1u32 << 10).to_le_bytes());
        assert!(matches!(decode_object(encoding, &short, 1 << 20), Err(DecodeError::BadContent { .. })));
        // One that holds fewer is refused too.
        let mut long = stored.clone();
        long[..4].copy_from_slice(&((1u32 << 20) + 1).to_le_bytes());
        assert!(matches!(decode_object(encoding, &long, 1 << 21), Err(DecodeError::BadContent { .. })));
        for cut in 0..stored.len() {
            assert!(decode_object(encoding, &stored[..cut], 1 << 20).is_err(), "cut at {cut}");
        }
        let mut garbage = (1u32 << 10).to_le_bytes().to_vec();
        garbage.extend_from_slice(b"not a zstd frame at all");
        assert!(matches!(decode_object(encoding, &garbage, 1 << 20), Err(DecodeError::BadContent { .. })));
    }

    #[test]
    fn a_decompression_bomb_fails_closed() {
        let big = vec![0u8; 1 << 20];
        let (encoding, stored) = encode_object(&big);
        assert_eq!(encoding, ENCODING_LZ4);
        assert!(stored.len() < 8 << 10);
        assert_eq!(
            decode_object(encoding, &stored, 1 << 16).unwrap_err(),
            DecodeError::TooLarge { size: 1 << 20, max: 1 << 16 }
        );
        // A declared length that lies about the block is refused, not trusted.
        let mut lying = stored.clone();
        lying[..4].copy_from_slice(&(1u32 << 10).to_le_bytes());
        assert!(matches!(decode_object(encoding, &lying, 1 << 20), Err(DecodeError::BadContent { .. })));
        assert!(matches!(decode_object(7, &stored, 1 << 20), Err(DecodeError::BadContent { .. })));
        let mut flipped = stored;
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(decode_object(encoding, &flipped, 1 << 20).map_or(true, |b| b.as_ref() != big.as_slice()));
    }
}
