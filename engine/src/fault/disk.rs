//! A simulated disk for deterministic simulation: a redb [`StorageBackend`] kept in
//! memory that does what a real disk may do when the power fails.
//!
//! Every file of a [`SimDisk`] keeps its *durable image* (its bytes as of the last
//! `sync_data` that completed) and the writes and length changes made since, in order.
//! Reads see every write, as a page cache does. At a power loss
//! ([`SimDisk::lose_power`]) each file comes back as its durable image plus a
//! seed-chosen subset of the writes since, applied in a seed-chosen order; a write that
//! is partly applied *tears* at a 512-byte sector boundary (the sectors before the
//! boundary new and the rest old, or the other way round), and a length change may or
//! may not survive. A process crash ([`SimDisk::kill`]) keeps every write, as the
//! kernel would.
//!
//! I/O calls (reads, writes, length changes and syncs of every file of the disk) are
//! counted, one counter for the whole disk, so one seed can name "the 37th I/O call
//! from now" across the log and the projections file. [`SimDisk::fail_call`] makes such
//! a call fail with an error the caller sees (a failed write may still have reached the
//! page cache, whole or torn: the seed decides); [`SimDisk::lose_power_at_call`] cuts
//! the power just before it.
//!
//! After a power loss or a crash the handles open at that moment are *detached*: the
//! engine that holds them keeps running on a private copy of what it saw, and nothing it
//! writes reaches the disk any more, as if its process had died with the machine. New
//! handles from [`SimDisk::file`] open the surviving images. Everything the disk decides
//! comes from its seed, so a run driven by one thread replays exactly.
//!
//! ```
//! use annal::fault::disk::SimDisk;
//! let disk = SimDisk::new(7);
//! let options = annal::Options { cache_bytes: 1 << 20, ..annal::Options::default() };
//! let engine = annal::Engine::open_with_backends(disk.file("log"), disk.file("projections"), options.clone()).unwrap();
//! engine.create_session(annal::CreateSession::new()).unwrap();
//! disk.lose_power();
//! drop(engine);
//! // The session was acknowledged, so it was fsynced: it survives.
//! let engine = annal::Engine::open_with_backends(disk.file("log"), disk.file("projections"), options).unwrap();
//! assert_eq!(engine.tip().unwrap().0, 1);
//! ```

use parking_lot::Mutex;
use redb::StorageBackend;
use std::fmt;
use std::io;
use std::ops::Bound;
use std::sync::Arc;

/// The sector size: a torn write splits at a multiple of it, and a write of one aligned
/// sector never tears.
pub const SECTOR: u64 = 512;

/// A small seeded pseudo-random generator (SplitMix64): the simulation's only source of
/// choices, so that a seed replays exactly.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed ^ 0x5eed_d15c_0000_0001)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// What kind of I/O call a fault hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// `read`.
    Read,
    /// `write`.
    Write,
    /// `set_len`.
    SetLen,
    /// `sync_data`.
    Sync,
}

/// A fault that [`SimDisk::fail_call`] armed and that has fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fired {
    /// The number of the failed call (see [`SimDisk::io_calls`]).
    pub call: u64,
    /// The file's name.
    pub file: String,
    /// The kind of call.
    pub kind: IoKind,
    /// For a failed write: whether its bytes reached the page cache anyway (whole or torn).
    pub landed: bool,
}

/// What a power loss did to the writes that were not yet durable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PowerLoss {
    /// The I/O call count when the power went.
    pub call: u64,
    /// Writes since the last completed sync, over every file.
    pub pending: u64,
    /// Of those, writes that reached the disk whole.
    pub kept: u64,
    /// Writes that reached the disk in part (torn at a sector boundary).
    pub torn: u64,
    /// Whether the kept writes reached the disk in another order than they were made.
    pub reordered: bool,
}

#[derive(Clone, Debug)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

/// One file: what reads see, what survives a power loss, and what happened in between.
#[derive(Clone, Debug, Default)]
struct Image {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

fn put(bytes: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[offset as usize..end].copy_from_slice(data);
}

impl Image {
    fn write(&mut self, offset: u64, data: &[u8]) {
        put(&mut self.current, offset, data);
        self.pending.push(Pending::Write { offset, data: data.to_vec() });
    }

    fn set_len(&mut self, len: u64) {
        self.current.resize(len as usize, 0);
        self.pending.push(Pending::SetLen(len));
    }

    /// Makes every pending change durable: applied in order to the durable image, which
    /// then equals what reads see. Costs what was written since the last sync, not the
    /// file's size.
    fn sync(&mut self) {
        for p in self.pending.drain(..) {
            match p {
                Pending::Write { offset, data } => put(&mut self.durable, offset, &data),
                Pending::SetLen(len) => self.durable.resize(len as usize, 0),
            }
        }
        debug_assert_eq!(self.durable.len(), self.current.len());
    }

    /// What survives a power loss: the durable image, the pending writes the seed keeps
    /// (some torn), in the order it picks, within the length it picks.
    fn survivor(&self, rng: &mut SimRng, loss: &mut PowerLoss) -> Image {
        let writes: Vec<(u64, &[u8])> = self
            .pending
            .iter()
            .filter_map(|p| match p {
                Pending::Write { offset, data } => Some((*offset, data.as_slice())),
                Pending::SetLen(_) => None,
            })
            .collect();
        loss.pending += writes.len() as u64;
        let resized = self.pending.iter().any(|p| matches!(p, Pending::SetLen(_)));
        let len = if resized && rng.chance(1, 2) { self.durable.len() } else { self.current.len() };
        // How likely each write is to have reached the disk, for this file and this loss.
        let keep = [0, 1, 2, 3, 4][rng.below(5) as usize];
        let mut kept: Vec<(u64, &[u8])> = Vec::new();
        for (offset, data) in writes {
            if !rng.chance(keep, 4) {
                continue;
            }
            let first = offset / SECTOR + 1;
            let last = (offset + data.len() as u64).div_ceil(SECTOR);
            // Sector boundaries strictly inside the write.
            let inside = last.saturating_sub(first);
            if inside > 0 && rng.chance(1, 6) {
                let cut = (first + rng.below(inside)) * SECTOR - offset;
                let cut = cut as usize;
                loss.torn += 1;
                if rng.chance(1, 2) {
                    kept.push((offset, &data[..cut]));
                } else {
                    kept.push((offset + cut as u64, &data[cut..]));
                }
            } else {
                loss.kept += 1;
                kept.push((offset, data));
            }
        }
        if kept.len() > 1 && rng.chance(1, 2) {
            for i in (1..kept.len()).rev() {
                kept.swap(i, rng.below(i as u64 + 1) as usize);
            }
            loss.reordered = true;
        }
        let mut bytes = self.durable.clone();
        for (offset, data) in kept {
            put(&mut bytes, offset, data);
        }
        bytes.resize(len, 0);
        Image { current: bytes.clone(), durable: bytes, pending: Vec::new() }
    }
}

#[derive(Debug, Default)]
struct File {
    name: String,
    /// Bumped at every power loss and crash; handles of an older generation are detached.
    generation: u64,
    /// Handles of a generation below this one are severed: every call on them fails.
    severed_below: u64,
    image: Image,
}

#[derive(Debug)]
struct World {
    rng: SimRng,
    files: Vec<File>,
    /// Private images of detached handles: (file index, generation) → image.
    detached: Vec<((usize, u64), Image)>,
    calls: u64,
    paused: bool,
    fail_at: Option<u64>,
    power_at: Option<u64>,
    fired: Option<Fired>,
    power_lost: Option<PowerLoss>,
    trace: u64,
}

impl World {
    fn index(&mut self, name: &str) -> usize {
        match self.files.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.files.push(File { name: name.to_string(), ..File::default() });
                self.files.len() - 1
            }
        }
    }

    fn detach_all(&mut self, survivors: Vec<Image>) {
        for (i, (file, survivor)) in self.files.iter_mut().zip(survivors).enumerate() {
            let old = std::mem::replace(&mut file.image, survivor);
            self.detached.push(((i, file.generation), old));
            file.generation += 1;
        }
    }

    /// Cuts the power; `armed` says whether an armed call did it (then
    /// [`SimDisk::take_power_loss`] reports it).
    fn lose_power(&mut self, armed: bool) -> PowerLoss {
        let mut loss = PowerLoss { call: self.calls, ..PowerLoss::default() };
        let mut survivors = Vec::with_capacity(self.files.len());
        for i in 0..self.files.len() {
            let survivor = self.files[i].image.survivor(&mut self.rng, &mut loss);
            survivors.push(survivor);
        }
        self.detach_all(survivors);
        if armed {
            self.power_lost = Some(loss.clone());
        }
        loss
    }

    /// The private image of a detached handle (empty if it was forgotten).
    fn detached_image(&mut self, index: usize, generation: u64) -> &mut Image {
        let key = (index, generation);
        let at = match self.detached.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                self.detached.push((key, Image::default()));
                self.detached.len() - 1
            }
        };
        &mut self.detached[at].1
    }

    fn trace(&mut self, file: usize, kind: IoKind, offset: u64, len: u64) {
        for word in [file as u64, kind as u64, offset, len] {
            self.trace = (self.trace ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A simulated disk holding named files. Clones share it. See the module documentation.
#[derive(Clone)]
pub struct SimDisk(Arc<Mutex<World>>);

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDisk").finish_non_exhaustive()
    }
}

impl SimDisk {
    /// An empty disk whose choices (what survives a power loss, how a failed write
    /// lands) follow `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk(Arc::new(Mutex::new(World {
            rng: SimRng::new(seed),
            files: Vec::new(),
            detached: Vec::new(),
            calls: 0,
            paused: false,
            fail_at: None,
            power_at: None,
            fired: None,
            power_lost: None,
            trace: 0xcbf2_9ce4_8422_2325,
        })))
    }

    /// A handle on the file `name` (created empty if new), for a database to open.
    pub fn file(&self, name: &str) -> SimFile {
        let mut world = self.0.lock();
        let index = world.index(name);
        let generation = world.files[index].generation;
        SimFile { disk: self.clone(), index, generation }
    }

    /// The file's bytes as reads see them now (`None` if there is no such file).
    pub fn image(&self, name: &str) -> Option<Vec<u8>> {
        let world = self.0.lock();
        world.files.iter().find(|f| f.name == name).map(|f| f.image.current.clone())
    }

    /// Replaces the file's bytes, durably (a new file if there is none).
    pub fn set_image(&self, name: &str, bytes: Vec<u8>) {
        let mut world = self.0.lock();
        let index = world.index(name);
        world.files[index].image = Image { current: bytes.clone(), durable: bytes, pending: Vec::new() };
    }

    /// I/O calls counted so far (reads, writes, length changes and syncs of every file,
    /// while not paused).
    pub fn io_calls(&self) -> u64 {
        self.0.lock().calls
    }

    /// Makes the call `n` calls from now fail (0: the next one). Replaces any fault
    /// armed before.
    pub fn fail_call(&self, n: u64) {
        let mut world = self.0.lock();
        world.fail_at = Some(world.calls + n);
    }

    /// Cuts the power just before the call `n` calls from now (0: the next one): the
    /// disk keeps what [`SimDisk::lose_power`] would keep, and every handle open then is
    /// detached.
    pub fn lose_power_at_call(&self, n: u64) {
        let mut world = self.0.lock();
        world.power_at = Some(world.calls + n);
    }

    /// Forgets the armed fault and power loss.
    pub fn disarm(&self) {
        let mut world = self.0.lock();
        world.fail_at = None;
        world.power_at = None;
    }

    /// While paused, calls are neither counted nor faulted (for checks between steps).
    pub fn pause(&self, paused: bool) {
        self.0.lock().paused = paused;
    }

    /// The fault that fired since the last call, if one did.
    pub fn take_fired(&self) -> Option<Fired> {
        self.0.lock().fired.take()
    }

    /// The power loss an armed call ([`SimDisk::lose_power_at_call`]) caused since the
    /// last call, if one did.
    pub fn take_power_loss(&self) -> Option<PowerLoss> {
        self.0.lock().power_lost.take()
    }

    /// Cuts the power now: every file keeps its durable image and a seed-chosen part of
    /// the writes since its last sync, and the handles open now are detached.
    pub fn lose_power(&self) -> PowerLoss {
        self.0.lock().lose_power(false)
    }

    /// Kills the process now: every write survives (the kernel holds it), and the
    /// handles open now are detached.
    pub fn kill(&self) {
        let mut world = self.0.lock();
        let survivors: Vec<Image> = world
            .files
            .iter()
            .map(|f| Image { current: f.image.current.clone(), durable: f.image.current.clone(), pending: Vec::new() })
            .collect();
        world.detach_all(survivors);
    }

    /// Drops the private images of detached handles whose engine is gone.
    pub fn forget_detached(&self) {
        self.0.lock().detached.clear();
    }

    /// Severs the handles detached so far: the process that held them is gone, so every
    /// later call on them fails (an error, never a panic) and their private images are
    /// dropped. Severing before dropping the engine that holds them spares the work its
    /// close would do on files that no longer matter (a redb close commits); it touches
    /// neither the disk nor its generator, so a run replays the same either way.
    pub fn sever_detached(&self) {
        let mut world = self.0.lock();
        for file in &mut world.files {
            file.severed_below = file.generation;
        }
        world.detached.clear();
    }

    /// A digest of every counted call so far (file, kind, offset, length): two runs of
    /// one seed have the same digest when their I/O was the same.
    pub fn trace_digest(&self) -> u64 {
        self.0.lock().trace
    }

    /// Draws a number in `0..n` from the disk's generator.
    pub fn below(&self, n: u64) -> u64 {
        self.0.lock().rng.below(n)
    }
}

/// One file of a [`SimDisk`], as a redb storage backend.
pub struct SimFile {
    disk: SimDisk,
    index: usize,
    generation: u64,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile").field("index", &self.index).field("generation", &self.generation).finish()
    }
}

fn injected(kind: IoKind) -> io::Error {
    io::Error::other(format!("simulated {kind:?} failure"))
}

fn severed() -> io::Error {
    io::Error::other("simulated: the process that held this handle is gone")
}

impl SimFile {
    /// Runs one call: on the file if this handle is attached (counted, maybe faulted),
    /// else on the handle's private image.
    fn call<T>(
        &self,
        kind: IoKind,
        offset: u64,
        len: u64,
        f: impl FnOnce(&mut Image) -> io::Result<T>,
        on_fault: impl FnOnce(&mut Image, &mut SimRng) -> bool,
    ) -> io::Result<T> {
        let mut guard = self.disk.0.lock();
        let world = &mut *guard;
        if self.generation < world.files[self.index].severed_below {
            return Err(severed());
        }
        if world.files[self.index].generation != self.generation {
            return f(world.detached_image(self.index, self.generation));
        }
        if !world.paused {
            let call = world.calls;
            world.calls += 1;
            world.trace(self.index, kind, offset, len);
            if world.power_at == Some(call) {
                world.power_at = None;
                world.lose_power(true);
                // This call, and every later one of this handle, runs detached.
                return f(world.detached_image(self.index, self.generation));
            }
            if world.fail_at == Some(call) {
                world.fail_at = None;
                let landed = on_fault(&mut world.files[self.index].image, &mut world.rng);
                world.fired = Some(Fired { call, file: world.files[self.index].name.clone(), kind, landed });
                return Err(injected(kind));
            }
        }
        f(&mut world.files[self.index].image)
    }
}

impl StorageBackend for SimFile {
    fn len(&self) -> Result<u64, io::Error> {
        let world = self.disk.0.lock();
        if self.generation < world.files[self.index].severed_below {
            return Err(severed());
        }
        if world.files[self.index].generation != self.generation {
            let key = (self.index, self.generation);
            let len = world.detached.iter().find(|(k, _)| *k == key).map_or(0, |(_, i)| i.current.len());
            return Ok(len as u64);
        }
        Ok(world.files[self.index].image.current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.call(
            IoKind::Read,
            offset,
            out.len() as u64,
            |image| {
                let end = offset as usize + out.len();
                match image.current.get(offset as usize..end) {
                    Some(bytes) => {
                        out.copy_from_slice(bytes);
                        Ok(())
                    }
                    None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the file")),
                }
            },
            |_, _| false,
        )
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.call(
            IoKind::SetLen,
            len,
            0,
            |image| {
                image.set_len(len);
                Ok(())
            },
            |image, rng| {
                let landed = rng.chance(1, 2);
                if landed {
                    image.set_len(len);
                }
                landed
            },
        )
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.call(
            IoKind::Sync,
            0,
            0,
            |image| {
                image.sync();
                Ok(())
            },
            |_, _| false,
        )
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.call(
            IoKind::Write,
            offset,
            data.len() as u64,
            |image| {
                image.write(offset, data);
                Ok(())
            },
            |image, rng| match rng.below(3) {
                0 => false,
                1 => {
                    image.write(offset, data);
                    true
                }
                _ => {
                    // Torn: the sectors up to a boundary inside the write reached the cache.
                    let first = offset / SECTOR + 1;
                    let last = (offset + data.len() as u64).div_ceil(SECTOR);
                    let cut = match last.saturating_sub(first) {
                        0 => data.len(),
                        inside => ((first + rng.below(inside)) * SECTOR - offset) as usize,
                    };
                    image.write(offset, &data[..cut]);
                    true
                }
            },
        )
    }

    fn try_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, redb::BackendError> {
        Ok(true)
    }

    fn try_lock_shared_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, redb::BackendError> {
        Ok(true)
    }

    fn lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }

    fn lock_shared_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }

    fn unlock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }

    fn query_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, redb::BackendError> {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synced_write_survives_and_a_pending_one_may_not() {
        for seed in 0..64 {
            let disk = SimDisk::new(seed);
            let f = disk.file("f");
            f.write(0, &[1; 1024]).unwrap();
            f.sync_data().unwrap();
            f.write(0, &[2; 1024]).unwrap();
            disk.lose_power();
            let after = disk.image("f").unwrap();
            assert_eq!(after.len(), 1024);
            // Each sector is old or new, never anything else.
            for sector in after.chunks(SECTOR as usize) {
                assert!(sector.iter().all(|b| *b == 1) || sector.iter().all(|b| *b == 2), "seed {seed}");
            }
            // The detached handle still sees its own writes; new writes do not reach the disk.
            let mut out = [0; 4];
            f.read(0, &mut out).unwrap();
            assert_eq!(out, [2; 4]);
            f.write(0, &[3; 4]).unwrap();
            assert_eq!(disk.image("f").unwrap(), after);
        }
    }

    #[test]
    fn a_severed_handle_fails_every_call_and_leaves_the_disk_alone() {
        let disk = SimDisk::new(3);
        let f = disk.file("f");
        f.write(0, &[1; 8]).unwrap();
        f.sync_data().unwrap();
        disk.kill();
        // Detached: the handle still runs on its private image.
        f.write(0, &[2; 8]).unwrap();
        let calls = disk.io_calls();
        disk.sever_detached();
        let mut out = [0; 8];
        assert!(f.read(0, &mut out).is_err());
        assert!(f.write(0, &[3; 8]).is_err());
        assert!(f.set_len(4).is_err());
        assert!(f.sync_data().is_err());
        assert!(f.len().is_err());
        assert_eq!(disk.image("f").unwrap(), vec![1; 8]);
        assert_eq!(disk.io_calls(), calls, "severed calls are not counted");
        // A handle taken now is attached, and is not severed.
        let g = disk.file("f");
        g.read(0, &mut out).unwrap();
        assert_eq!(out, [1; 8]);
        g.write(0, &[4; 8]).unwrap();
        assert_eq!(disk.image("f").unwrap(), vec![4; 8]);
    }

    #[test]
    fn an_armed_fault_fails_exactly_that_call() {
        let disk = SimDisk::new(1);
        let f = disk.file("f");
        f.set_len(16).unwrap();
        disk.fail_call(1);
        f.write(0, &[1; 4]).unwrap();
        assert!(f.sync_data().is_err());
        let fired = disk.take_fired().unwrap();
        assert_eq!((fired.call, fired.kind), (2, IoKind::Sync));
        f.sync_data().unwrap();
        assert_eq!(disk.io_calls(), 4);
    }
}
