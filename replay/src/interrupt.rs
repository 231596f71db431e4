//! Scratch files and directories that do not outlive an interrupted command.
//!
//! Some commands work in a directory of their own: the demo's database, and the fold of
//! a shared log that `verify`, `export`, `stats` and `rebuild --from` read; `rebuild`
//! writes a new projections file beside the old one. A [`tempfile::TempDir`] removes its
//! directory when it is dropped, but Ctrl-C (`SIGINT`) or `SIGTERM` ends the process
//! without running destructors, and a fold of a long log left behind can be gigabytes.
//!
//! The `annal` command calls [`remove_scratch_on_signal`] first. A path registered with
//! [`Scratch::new`] is then removed when one of those signals arrives, before the
//! process ends as the signal's default action would end it (the shell sees the same
//! status as without the handler). A library caller that installs nothing keeps the
//! signals' default actions; registering costs it a lock and a path.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};

/// Paths to remove when the process is interrupted, once per registration.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A directory or a file registered for removal on `SIGINT` or `SIGTERM` while this
/// value lives.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Registers `path`: a directory (removed with what it holds) or a file, which the
    /// caller removes or keeps itself when it is done.
    pub fn new(path: &Path) -> Scratch {
        SCRATCH.lock().push(path.to_path_buf());
        Scratch { path: path.to_path_buf() }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let mut dirs = SCRATCH.lock();
        if let Some(at) = dirs.iter().position(|p| *p == self.path) {
            dirs.swap_remove(at);
        }
    }
}

/// Starts a thread that, on `SIGINT` or `SIGTERM`, removes every registered path and
/// then ends the process as the signal's default action does.
pub fn remove_scratch_on_signal() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new().name("annal-signals".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            remove_registered();
            let _ = signal_hook::low_level::emulate_default_handler(signal);
            // Only reached if the default action did not end the process.
            std::process::exit(128 + signal);
        }
    })?;
    Ok(())
}

/// Removes every registered path. A file the command creates in a directory meanwhile
/// can make the first removal fail; a second one takes it.
fn remove_registered() {
    let paths = SCRATCH.lock().clone();
    for path in paths {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {
                if std::fs::remove_dir_all(&path).is_err() {
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
            Ok(_) => drop(std::fs::remove_file(&path)),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_directory_is_registered_while_it_lives_and_removed_on_a_signal() {
        let parent = tempfile::tempdir().unwrap();
        let (kept, dropped) = (parent.path().join("kept"), parent.path().join("dropped"));
        let file = parent.path().join("new.projections");
        std::fs::create_dir_all(kept.join("inner")).unwrap();
        std::fs::write(kept.join("inner/file"), b"x").unwrap();
        std::fs::create_dir(&dropped).unwrap();
        std::fs::write(&file, b"y").unwrap();
        let guards = [Scratch::new(&kept), Scratch::new(&file), Scratch::new(&parent.path().join("never made"))];
        drop(Scratch::new(&dropped));
        assert!(SCRATCH.lock().contains(&kept) && !SCRATCH.lock().contains(&dropped));
        remove_registered();
        assert!(!kept.exists(), "a registered directory goes, with what it holds");
        assert!(!file.exists(), "a registered file goes");
        assert!(dropped.exists(), "a directory whose registration ended stays");
        drop(guards);
        assert!(!SCRATCH.lock().contains(&kept));
    }
}
