//! CPU time and memory of the service's processes, read from `/proc`.
//!
//! CPU is `utime + stime` of `/proc/<pid>/stat` (every thread of the process, user and kernel
//! time, in clock ticks), read before and after a run; the difference over the joins of the run
//! is the CPU cost of one join. Memory is `VmHWM` of `/proc/<pid>/status`: the peak resident set
//! since the process started (the kernel keeps it; sampling could miss a short peak), and `VmRSS`,
//! the resident set when sampled.

use std::path::Path;

/// Why a process could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// `/proc/<pid>/...` could not be read (the process is gone, or never existed).
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file does not have the layout the kernel documents (proc(5)).
    #[error("unexpected format of {path}: {reason}")]
    Format { path: String, reason: String },
}

/// What `/proc/<pid>/stat` says about CPU and parentage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The command name (at most 15 bytes; the kernel truncates it).
    pub comm: String,
    /// The parent's pid.
    pub ppid: u32,
    /// User-mode CPU time of all threads, in clock ticks.
    pub utime: u64,
    /// Kernel-mode CPU time of all threads, in clock ticks.
    pub stime: u64,
}

impl Stat {
    /// User plus kernel time, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.utime + self.stime
    }
}

/// Parses the one line of `/proc/<pid>/stat`.
///
/// The command name sits in parentheses and may itself contain spaces and parentheses, so the
/// fields are counted from the *last* `)`: then come state (field 3), ppid (4), ... utime (14)
/// and stime (15).
pub fn parse_stat(text: &str) -> Result<Stat, String> {
    let open = text.find('(').ok_or("no '(' before the command name")?;
    let close = text.rfind(')').ok_or("no ')' after the command name")?;
    if close < open {
        return Err("')' before '('".to_owned());
    }
    let comm = text[open + 1..close].to_owned();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // fields[0] is field 3 of proc(5), so field n is fields[n - 3].
    let field = |n: usize| -> Result<u64, String> {
        let raw = fields
            .get(n - 3)
            .ok_or_else(|| format!("field {n} is missing"))?;
        raw.parse::<u64>()
            .map_err(|_| format!("field {n} is not a number: {raw:?}"))
    };
    let ppid = field(4)?;
    Ok(Stat {
        comm,
        ppid: u32::try_from(ppid).map_err(|_| format!("ppid {ppid} out of range"))?,
        utime: field(14)?,
        stime: field(15)?,
    })
}

/// A `kB` value of `/proc/<pid>/status` (such as `VmHWM`), in bytes; `None` if the key is absent
/// (kernel threads have no `VmHWM`).
pub fn parse_status_kib(text: &str, key: &str) -> Result<Option<u64>, String> {
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name != key {
            continue;
        }
        let mut parts = value.split_whitespace();
        let number = parts.next().ok_or_else(|| format!("{key} has no value"))?;
        let unit = parts.next();
        if unit != Some("kB") {
            return Err(format!("{key} is in {unit:?}, expected kB"));
        }
        let kib: u64 = number
            .parse()
            .map_err(|_| format!("{key} is not a number: {number:?}"))?;
        return Ok(Some(kib * 1024));
    }
    Ok(None)
}

fn read(path: &str) -> Result<String, ProcError> {
    std::fs::read_to_string(path).map_err(|source| ProcError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads `/proc/<pid>/stat`.
pub fn stat(pid: u32) -> Result<Stat, ProcError> {
    let path = format!("/proc/{pid}/stat");
    parse_stat(&read(&path)?).map_err(|reason| ProcError::Format { path, reason })
}

/// Memory of one process, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `VmHWM`: the peak resident set since the process started.
    pub peak_rss: u64,
    /// `VmRSS`: the resident set now.
    pub rss: u64,
}

/// Reads `VmHWM` and `VmRSS` of `/proc/<pid>/status`.
pub fn memory(pid: u32) -> Result<Memory, ProcError> {
    let path = format!("/proc/{pid}/status");
    let text = read(&path)?;
    let get = |key| {
        parse_status_kib(&text, key)
            .map(Option::unwrap_or_default)
            .map_err(|reason| ProcError::Format {
                path: path.clone(),
                reason,
            })
    };
    Ok(Memory {
        peak_rss: get("VmHWM")?,
        rss: get("VmRSS")?,
    })
}

/// Clock ticks per second, the unit of `utime` and `stime`.
///
/// This is `sysconf(_SC_CLK_TCK)`; without libc (the workspace forbids unsafe code) it is asked
/// of `getconf`. Linux has reported 100 on every architecture for decades, hence the fallback.
pub fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .filter(|&ticks| ticks > 0)
        .unwrap_or(100)
}

/// The pids and command names of `parent`'s children, found by scanning `/proc`.
pub fn children(parent: u32) -> Result<Vec<(u32, String)>, ProcError> {
    let entries = std::fs::read_dir("/proc").map_err(|source| ProcError::Read {
        path: "/proc".to_owned(),
        source,
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // Processes come and go while we scan; one that vanished is simply not a child.
        if let Ok(stat) = stat(pid) {
            if stat.ppid == parent {
                found.push((pid, stat.comm));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Whether `/proc/<pid>` exists.
pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The Kubernetes control plane's processes (by `comm`): reported apart from the service's.
pub const CONTROL_PLANE: [&str; 2] = ["kube-apiserver", "etcd"];

/// A process whose cost is measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    /// What to call it in reports (e.g. `attest-proxy`).
    pub name: String,
    pub pid: u32,
    /// Server-side processes count toward the service's CPU per operation; the load
    /// generator's own process is watched too but reported apart.
    pub server_side: bool,
}

/// One reading of a watched process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub cpu_ticks: u64,
    pub memory: Memory,
}

/// Reads every watched process once.
pub fn sample(watched: &[Watched]) -> Result<Vec<Sample>, ProcError> {
    watched
        .iter()
        .map(|w| {
            Ok(Sample {
                cpu_ticks: stat(w.pid)?.cpu_ticks(),
                memory: memory(w.pid)?,
            })
        })
        .collect()
}

/// CPU seconds between two readings of one process. A counter that went backwards (the pid was
/// reused by a new process) counts as zero rather than wrapping.
pub fn cpu_seconds(before: &Sample, after: &Sample, ticks_per_second: u64) -> f64 {
    after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / ticks_per_second.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line from a Linux 6.x kernel (tokio worker threads make comm odd, so the test uses
    // a name with a space and a parenthesis, which the kernel allows).
    const STAT: &str = "4242 (attest-proxy) S 4200 4242 4200 0 -1 4194560 1843 0 0 0 \
        1234 567 0 0 20 0 6 0 998877 123456789 4321 18446744073709551615 1 1 0 0 0 0 0 \
        4096 17642 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn stat_fields_counted_after_the_command_name() {
        let stat = parse_stat(STAT).unwrap();
        assert_eq!(
            stat,
            Stat {
                comm: "attest-proxy".to_owned(),
                ppid: 4200,
                utime: 1234,
                stime: 567,
            }
        );
        assert_eq!(stat.cpu_ticks(), 1801);
    }

    #[test]
    fn stat_command_name_with_spaces_and_parentheses() {
        let line = STAT.replace("(attest-proxy)", "(we) ird 1 2 (x)");
        let stat = parse_stat(&line).unwrap();
        assert_eq!(stat.comm, "we) ird 1 2 (x");
        assert_eq!((stat.ppid, stat.utime, stat.stime), (4200, 1234, 567));
    }

    #[test]
    fn stat_rejects_truncated_and_garbled_lines() {
        assert!(
            parse_stat("4242 (x) S 1 2 3")
                .unwrap_err()
                .contains("field 14")
        );
        assert!(parse_stat("no parentheses at all").is_err());
        let garbled = STAT.replace(" 1234 ", " 12x4 ");
        assert!(parse_stat(&garbled).unwrap_err().contains("field 14"));
    }

    #[test]
    fn status_values_in_bytes() {
        let status = "Name:\tjoin-core\nVmPeak:\t  300000 kB\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nThreads:\t3\n";
        assert_eq!(
            parse_status_kib(status, "VmHWM").unwrap(),
            Some(20480 * 1024)
        );
        assert_eq!(
            parse_status_kib(status, "VmRSS").unwrap(),
            Some(10240 * 1024)
        );
        // A prefix of another key must not match.
        assert_eq!(parse_status_kib(status, "VmH").unwrap(), None);
        assert!(parse_status_kib("VmHWM:\t12 MB\n", "VmHWM").is_err());
        assert!(parse_status_kib("VmHWM:\tlots kB\n", "VmHWM").is_err());
    }

    #[test]
    fn cpu_delta_in_seconds() {
        let before = Sample {
            cpu_ticks: 1000,
            memory: Memory::default(),
        };
        let after = Sample {
            cpu_ticks: 1250,
            memory: Memory::default(),
        };
        assert!((cpu_seconds(&before, &after, 100) - 2.5).abs() < 1e-9);
        // A reused pid makes the counter go backwards: zero, not a wrapped huge number.
        assert_eq!(cpu_seconds(&after, &before, 100), 0.0);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        // Burn some CPU so the counter moves by at least a tick or two.
        let before = stat(me).unwrap().cpu_ticks();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(60) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(stat(me).unwrap().cpu_ticks() > before);
        let memory = memory(me).unwrap();
        assert!(memory.peak_rss >= memory.rss && memory.rss > 0);
        assert!(clock_ticks_per_second() > 0);
        assert!(exists(me));
    }
}
