use annal_benches::stores::{annal_store::AnnalStore, SessionStore};
use annal_benches::workload::{self, Shape};
use std::time::Instant;

fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    let rounds: usize = std::env::args().nth(2).map_or(5, |s| s.parse().unwrap());
    let fresh = !dir.join("annal.redb").exists();
    std::fs::create_dir_all(&dir).unwrap();
    let store = AnnalStore::open(&dir).unwrap();
    if fresh {
        let system = workload::system_prompt(&Shape::agent(), 42);
        for level in [1usize, 4, 16, 64] {
            let ops = 3000usize.div_ceil(level);
            for i in 0..level {
                let plan = workload::session_plan(&Shape::agent(), 42, (level * 1000 + i) as u64, ops);
                let mut id = [0u8; 16];
                id[0] = 1;
                id[8..].copy_from_slice(&((level * 1000 + i) as u64).to_be_bytes());
                let mut cursor = store.create(id, &system).unwrap();
                for op in &plan {
                    store.apply(&mut cursor, op).unwrap();
                }
            }
        }
        store.quiesce().unwrap();
    }
    for _ in 0..rounds {
        let c0 = cpu();
        let t = Instant::now();
        let events = store.rebuild().unwrap();
        let s = t.elapsed().as_secs_f64();
        let c = cpu() - c0;
        println!("{events} events {:.1} ms {:.0} events/s cpu {:.1} ms", s * 1e3, events as f64 / s, c * 1e3);
    }
    Box::new(store).close().unwrap();
}

fn cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let (u, s): (f64, f64) = (f[11].parse().unwrap(), f[12].parse().unwrap());
    (u + s) / 100.0
}
