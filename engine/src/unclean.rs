//! Read-only opens of a file that its last writer did not close: after a crash, or a
//! host killed.
//!
//! redb marks a file it opens for writing as needing recovery, and clears the mark at a
//! clean close. A read-only open of a marked file that no live writer holds is refused
//! (`RepairAborted`): the repair (choosing the last valid commit slot and rebuilding the
//! allocator's state) writes to the file, and a reader must not. So every read command,
//! `annal verify` first, refused a database after its host was killed, until something
//! opened it for writing.
//!
//! [`open_read_only`] opens such a file over a copy-on-write view of it instead
//! ([`CopyOnWrite`]): reads come from the file, and whatever redb writes (the repair, the
//! header) stays in memory and is dropped with the database. The file is never opened
//! for writing, its bytes, size and times do not change, and the reader sees what an
//! open for writing would recover: the last durable commit of the log file. (The journal
//! beside it is read as it is, by the caller.)
//!
//! A host that opens the file for writing while such a reader reads it repairs the file
//! for real and may then reuse pages the reader's snapshot still reads, since the reader
//! holds no lock the host knows of; redb's checksums then make the reader's reads fail,
//! never answer wrongly, and the read command is run again.

use parking_lot::Mutex;
use redb::{ReadableDatabase, StorageBackend};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// A database opened for reading only, whichever way it was opened.
pub type ReadOnly = Arc<dyn ReadableDatabase + Send + Sync>;

/// Opens `path` for reading, as a reader beside a live writer does (redb's single-writer
/// mode), with a page cache of `cache_bytes`; a file its last writer left unclean, which
/// redb refuses to open read-only, is opened over a [`CopyOnWrite`] view of it that
/// takes the repair in memory. The file is never written. redb may panic on pages it
/// cannot make sense of (the repair reads every page of a damaged file); such a panic is
/// a `Corrupted` storage error here, so no caller takes its process down.
pub fn open_read_only(path: &Path, cache_bytes: usize) -> Result<ReadOnly, redb::DatabaseError> {
    let open = || -> Result<ReadOnly, redb::DatabaseError> {
        let mut b = redb::Builder::new();
        b.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
        b.set_cache_size(cache_bytes);
        match b.open_read_only(path) {
            Ok(db) => Ok(Arc::new(db)),
            Err(redb::DatabaseError::RepairAborted) => Ok(Arc::new(open_repaired(path, cache_bytes)?)),
            Err(e) => Err(e),
        }
    };
    std::panic::catch_unwind(open).unwrap_or_else(|panic| {
        let message = crate::error::panic_message(panic.as_ref());
        Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(format!(
            "the storage layer failed on damaged data: {message}"
        ))))
    })
}

/// Opens `path` as a database over a copy-on-write view of the file: redb repairs it in
/// memory. The view takes no lock, so the open is in redb's exclusive-writer mode (the
/// only one a backend without locks supports).
fn open_repaired(path: &Path, cache_bytes: usize) -> Result<redb::Database, redb::DatabaseError> {
    let view = CopyOnWrite::open(path).map_err(|e| redb::DatabaseError::Storage(redb::StorageError::from(e)))?;
    let mut b = redb::Builder::new();
    b.set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter);
    b.set_cache_size(cache_bytes);
    b.create_with_backend(view)
}

/// The unit the view keeps writes in.
const BLOCK: u64 = 4096;

/// A file seen through a layer of writes held in memory: a read returns the bytes
/// written to the layer where there are any, else the file's (zeros past its end, and
/// past any length the layer was cut to since). The file is opened read-only.
#[derive(Debug)]
pub struct CopyOnWrite {
    file: File,
    state: Mutex<Layer>,
}

#[derive(Debug)]
struct Layer {
    /// The length the view has.
    len: u64,
    /// The file's bytes show through below this offset only: the file's length, or the
    /// shortest length the view was cut to since.
    file_below: u64,
    /// Blocks written to, by index, each whole.
    blocks: HashMap<u64, Box<[u8]>>,
}

impl CopyOnWrite {
    /// A view of the file at `path`, opened read-only, with nothing written yet.
    pub fn open(path: &Path) -> io::Result<CopyOnWrite> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(CopyOnWrite { file, state: Mutex::new(Layer { len, file_below: len, blocks: HashMap::new() }) })
    }

    /// Fills `out` with the file's bytes at `offset` as the view shows them where no block
    /// was written: the file below `file_below`, zeros from there.
    fn read_file(&self, offset: u64, out: &mut [u8], file_below: u64) -> io::Result<()> {
        let from_file = file_below.saturating_sub(offset).min(out.len() as u64) as usize;
        self.file.read_exact_at(&mut out[..from_file], offset)?;
        out[from_file..].fill(0);
        Ok(())
    }
}

impl StorageBackend for CopyOnWrite {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.state.lock().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let state = self.state.lock();
        let end = offset.checked_add(out.len() as u64).filter(|&end| end <= state.len);
        if end.is_none() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the view"));
        }
        let mut done = 0usize;
        while done < out.len() {
            let at = offset + done as u64;
            let (block, within) = (at / BLOCK, (at % BLOCK) as usize);
            let n = (BLOCK as usize - within).min(out.len() - done);
            match state.blocks.get(&block) {
                Some(bytes) => out[done..done + n].copy_from_slice(&bytes[within..within + n]),
                None => {
                    // A run of blocks the layer does not hold: one read of the file.
                    let mut run = n;
                    while done + run < out.len() && !state.blocks.contains_key(&((at + run as u64) / BLOCK)) {
                        run += (BLOCK as usize).min(out.len() - done - run);
                    }
                    self.read_file(at, &mut out[done..done + run], state.file_below)?;
                    done += run;
                    continue;
                }
            }
            done += n;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut state = self.state.lock();
        if len < state.len {
            state.file_below = state.file_below.min(len);
            let first_gone = len.div_ceil(BLOCK);
            state.blocks.retain(|&block, _| block < first_gone);
            let within = (len % BLOCK) as usize;
            if within > 0 {
                if let Some(bytes) = state.blocks.get_mut(&(len / BLOCK)) {
                    bytes[within..].fill(0);
                }
            }
        }
        state.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut state = self.state.lock();
        let end = offset.checked_add(data.len() as u64).ok_or_else(|| past_u64(offset))?;
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let (block, within) = (at / BLOCK, (at % BLOCK) as usize);
            let n = (BLOCK as usize - within).min(data.len() - done);
            if !state.blocks.contains_key(&block) {
                let mut bytes = vec![0u8; BLOCK as usize].into_boxed_slice();
                let shown = state.len.min(state.file_below);
                self.read_file(block * BLOCK, &mut bytes, shown)?;
                state.blocks.insert(block, bytes);
            }
            if let Some(bytes) = state.blocks.get_mut(&block) {
                bytes[within..within + n].copy_from_slice(&data[done..done + n]);
            }
            done += n;
        }
        state.len = state.len.max(end);
        Ok(())
    }
}

/// The error of an access that would end past `u64::MAX` bytes.
fn past_u64(offset: u64) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("an access at offset {offset} ends past the largest offset"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        SetLen(u64),
        Read(u64, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..40_000, proptest::collection::vec(any::<u8>(), 0..9_000)).prop_map(|(o, d)| Op::Write(o, d)),
            (0u64..50_000).prop_map(Op::SetLen),
            (0u64..50_000, 0usize..12_000).prop_map(|(o, n)| Op::Read(o, n)),
        ]
    }

    /// A write whose end would pass the largest offset is refused, changing nothing,
    /// as a read past the end is.
    #[test]
    fn an_access_past_the_largest_offset_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [7u8; 100]).unwrap();
        let view = CopyOnWrite::open(&path).unwrap();
        let e = view.write(u64::MAX - 1, &[1, 2, 3]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(view.len().unwrap(), 100);
        assert!(view.read(u64::MAX - 1, &mut [0u8; 3]).is_err());
    }

    proptest! {
        /// The view answers as a plain copy of the file in memory does, and the file
        /// itself never changes.
        #[test]
        fn the_view_reads_as_a_copy_of_the_file(
            file_bytes in proptest::collection::vec(any::<u8>(), 0..30_000),
            ops in proptest::collection::vec(op(), 0..24),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            std::fs::write(&path, &file_bytes).unwrap();
            let view = CopyOnWrite::open(&path).unwrap();
            let mut copy = file_bytes.clone();
            for op in ops {
                match op {
                    Op::Write(offset, data) => {
                        view.write(offset, &data).unwrap();
                        let end = offset as usize + data.len();
                        if copy.len() < end {
                            copy.resize(end, 0);
                        }
                        copy[offset as usize..end].copy_from_slice(&data);
                    }
                    Op::SetLen(len) => {
                        view.set_len(len).unwrap();
                        copy.resize(len as usize, 0);
                    }
                    Op::Read(offset, n) => {
                        let mut out = vec![0xAA; n];
                        let got = view.read(offset, &mut out);
                        if offset as usize + n <= copy.len() {
                            prop_assert!(got.is_ok());
                            prop_assert_eq!(&out[..], &copy[offset as usize..offset as usize + n]);
                        } else {
                            prop_assert!(got.is_err());
                        }
                    }
                }
                prop_assert_eq!(view.len().unwrap(), copy.len() as u64);
            }
            prop_assert_eq!(std::fs::read(&path).unwrap(), file_bytes);
        }
    }
}
