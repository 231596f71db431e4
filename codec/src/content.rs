//! Content rows: the bytes of the content objects a record introduced, stored in the
//! `content` table under that record's sequence number, in the same transaction as the
//! record. A row is a concatenation of entries, in the order the record first refers to
//! them (a message object's attachments follow it):
//!
//! ```text
//! offset  size  field
//!  0      32    content id = blake3(canonical bytes)
//! 32       1    encoding: 0 = raw (the stored bytes are the canonical bytes)
//! 33       4    stored length n, u32 little-endian
//! 37       n    stored bytes
//! ```
//!
//! An empty row never exists: a record that introduces nothing has no content row.
//! Parsing checks every length against the row and the configured limit, so it never
//! panics and never allocates more than the row it was given.

use crate::ids::ContentId;
use crate::record::DecodeError;

/// Bytes before an entry's stored bytes.
pub const ENTRY_HEADER_LEN: usize = 37;

/// Encoding byte of an object stored as its canonical bytes.
pub const ENCODING_RAW: u8 = 0;

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
    /// The canonical bytes, if they hash to the stored id.
    pub fn verify(&self) -> Option<&'a [u8]> {
        (self.encoding == ENCODING_RAW && crate::content_id(self.stored) == self.id).then_some(self.stored)
    }
}

/// Appends one raw entry to `row`.
pub fn push_entry(row: &mut Vec<u8>, id: &ContentId, bytes: &[u8]) {
    row.reserve(ENTRY_HEADER_LEN + bytes.len());
    row.extend_from_slice(&id.0);
    row.push(ENCODING_RAW);
    row.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    row.extend_from_slice(bytes);
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
        assert_eq!(parsed[0].verify(), Some(a));
        assert_eq!(parsed[1].verify(), Some(b));
        assert_eq!(find(&row, &crate::content_id(b), 1 << 20).unwrap().unwrap().stored, b);
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
        row[40] ^= 1;
        assert_eq!(entries(&row, 1 << 20).next().unwrap().unwrap().verify(), None);
    }
}
