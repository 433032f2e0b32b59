//! Server footprint from /proc: resident memory of a whole process tree (sampled every 10 ms
//! for the peak), all of it and its anonymous part, and CPU time. Linux only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// How often the set of descendants is re-read (scanning /proc is the costly part).
const TREE_EVERY: u32 = 50;

/// Clock ticks per second for /proc CPU fields.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The fields after the command name in /proc/PID/stat (the name may contain spaces).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// `pid` and all its live descendants.
pub fn process_tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // Field 4 of stat (index 1 after the name) is the parent pid.
            if let Some(ppid) = stat_fields(pid).and_then(|f| f.get(1)?.parse::<u32>().ok()) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        if let Some(kids) = children.get(&tree[i]) {
            tree.extend(kids);
        }
        i += 1;
    }
    tree
}

/// Resident memory in bytes: all of it (`VmRSS`), and its anonymous part (`RssAnon`: heap and
/// stacks, without the mapped binary or files), which the published method compares.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Resident {
    pub rss: u64,
    pub anon: u64,
}

impl Resident {
    fn max(self, other: Self) -> Self {
        Self {
            rss: self.rss.max(other.rss),
            anon: self.anon.max(other.anon),
        }
    }
}

/// Resident memory of one process.
pub fn resident(pid: u32) -> Option<Resident> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(Resident {
        rss: kib_field(&status, "VmRSS:")?,
        anon: kib_field(&status, "RssAnon:")?,
    })
}

/// The value of a `Name:   1234 kB` line of a `/proc` file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Resident memory of a process tree, summed over its members.
pub fn tree_resident(tree: &[u32]) -> Resident {
    tree.iter()
        .filter_map(|p| resident(*p))
        .fold(Resident::default(), |sum, r| Resident {
            rss: sum.rss + r.rss,
            anon: sum.anon + r.anon,
        })
}

/// CPU seconds used by the tree: its live members plus the reaped children of the root.
pub fn tree_cpu_seconds(root: u32) -> f64 {
    let ticks = clock_ticks();
    let mut total = 0.0;
    for (i, pid) in process_tree(root).into_iter().enumerate() {
        let Some(f) = stat_fields(pid) else { continue };
        // utime, stime are fields 14, 15; cutime, cstime 16, 17 (indices 11..=14 here).
        let field = |n: usize| f.get(n).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        total += field(11) + field(12);
        if i == 0 {
            total += field(13) + field(14);
        }
    }
    total / ticks
}

/// Memory no one uses, not even the page cache (`MemFree`), in bytes.
pub fn free_memory_bytes() -> Option<u64> {
    kib_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemFree:")
}

/// CPU seconds used by this process (all threads) so far, not counting the servers it spawned.
pub fn self_cpu_seconds() -> f64 {
    let Some(f) = stat_fields(std::process::id()) else {
        return 0.0;
    };
    let field = |n: usize| f.get(n).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (field(11) + field(12)) / clock_ticks()
}

/// Samples the resident memory of several process trees every 10 ms and keeps each peak (of all
/// resident memory and of the anonymous part, each at its own moment).
pub struct PeakSampler {
    peaks: Arc<Mutex<HashMap<u32, Resident>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeakSampler {
    pub fn start(roots: Vec<u32>) -> Self {
        let peaks = Arc::new(Mutex::new(HashMap::<u32, Resident>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peaks, stop) = (peaks.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut trees: Vec<(u32, Vec<u32>)> = Vec::new();
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    if n.is_multiple_of(TREE_EVERY) {
                        trees = roots.iter().map(|r| (*r, process_tree(*r))).collect();
                    }
                    n = n.wrapping_add(1);
                    for (root, tree) in &trees {
                        let now = tree_resident(tree);
                        let mut peaks = peaks.lock().unwrap_or_else(|p| p.into_inner());
                        let peak = peaks.entry(*root).or_default();
                        *peak = peak.max(now);
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Self {
            peaks,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling and returns the peak resident memory of each root's tree.
    pub fn finish(mut self) -> HashMap<u32, Resident> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let peaks = self.peaks.lock().unwrap_or_else(|p| p.into_inner());
        peaks.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_measured() {
        let me = std::process::id();
        assert!(process_tree(me).contains(&me));
        let mine = resident(me).unwrap();
        assert!(mine.rss > 1024 * 1024);
        assert!(mine.anon > 0 && mine.anon < mine.rss, "{mine:?}");
        let burn: u64 = (0..20_000_000u64).fold(0, |a, b| a.wrapping_add(b * b));
        assert!(burn > 0);
        assert!(self_cpu_seconds() > 0.0);
        let sampler = PeakSampler::start(vec![me]);
        std::thread::sleep(Duration::from_millis(30));
        let peaks = sampler.finish();
        assert!(peaks[&me].anon > 0 && peaks[&me].rss >= peaks[&me].anon);
    }
}
