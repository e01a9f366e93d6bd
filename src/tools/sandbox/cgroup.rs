//! A cgroup per call, where one can be had (docs/design.md §10.5): `max_memory` and the process
//! limit then bound the whole call (every process it starts, together), for root too, and
//! the cgroup is killed as a whole when the call ends.
//!
//! vaultd looks, once at start, for hierarchies it may write below its own cgroup: cgroup v2
//! (memory, pids, `cgroup.kill`), or the v1 `memory` and `pids` hierarchies of a hybrid
//! system. It makes `vaultd-PID` there and one child per call (kept, once the call left it
//! empty, for a later call: [`Spare`]); the program's process joins it as
//! [`super::supervise::CgroupJoin`] says. Where none can be had (no
//! delegation to vaultd's user, a read-only /sys/fs/cgroup), the call is still bounded by its
//! supervisor ([`super::supervise`]) and per-process rlimits: `max_memory` per process
//! (RLIMIT_AS), the process limit per user (RLIMIT_NPROC, which the kernel never applies to
//! root). [`Cgroups::describe`] says which, for `vaultd tools`.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::supervise::CgroupJoin;

/// One hierarchy vaultd can make cgroups in.
#[derive(Debug)]
struct Hierarchy {
    /// `<mount>/<vaultd's cgroup>/vaultd-PID`, made at start, removed at exit.
    base: PathBuf,
    /// cgroup v2 (unified): `memory.max`, `pids.max`, `cgroup.kill`; else v1.
    unified: bool,
    memory: bool,
    pids: bool,
}

/// The hierarchies found at start; empty when no cgroup can be had.
#[derive(Debug, Default)]
pub struct Cgroups {
    hierarchies: Vec<Hierarchy>,
    /// Why no cgroup bounds memory or processes, for `vaultd tools`.
    problem: Option<String>,
    next: AtomicU64,
    /// Call cgroups a finished call left empty, for the next calls.
    spare: Arc<Mutex<Spare>>,
    /// Whether a program's process is born in its v2 cgroup (clone3 is not refused).
    clone_into: bool,
}

/// Empty call cgroups kept for reuse: making one (and removing it) is a `mkdir` per
/// hierarchy on the call's path, about 0.1 ms each here, where a reused one only has its
/// limits written.
#[derive(Debug, Default)]
struct Spare {
    /// One directory per hierarchy, in [`Cgroups::hierarchies`]' order.
    sets: Vec<Vec<PathBuf>>,
    /// Set when vaultd's cgroups are removed: a call ending later removes its own.
    closed: bool,
}

/// At most this many empty call cgroups are kept (more than the default worker count).
const MAX_SPARE: usize = 16;

/// The limits of one call's cgroup.
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    pub memory: u64,
    pub processes: u64,
}

impl Cgroups {
    /// Finds the writable hierarchies and makes `vaultd-PID` in each.
    pub fn discover() -> Cgroups {
        Cgroups::discover_as(&format!("vaultd-{}", std::process::id()))
    }

    /// This process's cgroups, found once and shared while anything holds them: a config
    /// reload builds its tools while the old ones still run calls, and both must use one
    /// `vaultd-PID` (and one spare list) rather than make and remove it under each other.
    pub fn shared() -> Arc<Cgroups> {
        static CURRENT: Mutex<std::sync::Weak<Cgroups>> = Mutex::new(std::sync::Weak::new());
        let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cgroups) = current.upgrade() {
            return cgroups;
        }
        let cgroups = Arc::new(Cgroups::discover());
        *current = Arc::downgrade(&cgroups);
        cgroups
    }

    /// As [`Cgroups::discover`], with `name` for vaultd's own cgroups.
    fn discover_as(name: &str) -> Cgroups {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut hierarchies = Vec::new();
        let mut problems = Vec::new();
        for line in mounts.lines() {
            let Some(m) = Mount::parse(line) else {
                continue;
            };
            let unified = m.fstype == "cgroup2";
            let (memory, pids) = if unified {
                (true, true)
            } else {
                (m.options.contains(&"memory"), m.options.contains(&"pids"))
            };
            if !(unified || memory || pids) {
                continue;
            }
            let Some(path) = own_path(&own, unified, &m.options) else {
                continue;
            };
            let Ok(rel) = Path::new(path).strip_prefix(m.root) else {
                continue;
            };
            let parent = Path::new(m.point).join(rel);
            remove_stale(&parent);
            let base = parent.join(name);
            if let Err(e) = std::fs::create_dir(&base)
                && e.kind() != std::io::ErrorKind::AlreadyExists
            {
                problems.push(format!("{}: {e}", base.display()));
                continue;
            }
            let (memory, pids) = if unified {
                enable_controllers(&base)
            } else {
                (memory, pids)
            };
            hierarchies.push(Hierarchy {
                base,
                unified,
                memory,
                pids,
            });
        }
        let bounded = |f: fn(&Hierarchy) -> bool| hierarchies.iter().any(f);
        let problem = if hierarchies.is_empty() {
            Some(if problems.is_empty() {
                "no cgroup hierarchy found".to_string()
            } else {
                format!("cannot make a cgroup ({})", problems.join("; "))
            })
        } else if !bounded(|h| h.memory) || !bounded(|h| h.pids) {
            Some("the memory or pids controller is not delegated to vaultd".to_string())
        } else {
            None
        };
        Cgroups {
            hierarchies,
            problem,
            next: AtomicU64::new(0),
            spare: Arc::default(),
            clone_into: super::supervise::can_clone_into_cgroup(),
        }
    }

    /// Whether a cgroup bounds the memory of the whole call.
    pub fn bounds_memory(&self) -> bool {
        self.hierarchies.iter().any(|h| h.memory)
    }

    /// Whether a cgroup bounds the processes of the whole call.
    pub fn bounds_processes(&self) -> bool {
        self.hierarchies.iter().any(|h| h.pids)
    }

    /// One line for the log and `vaultd tools`.
    pub fn describe(&self) -> String {
        let mut bounds = Vec::new();
        if self.bounds_memory() {
            bounds.push("memory");
        }
        if self.bounds_processes() {
            bounds.push("pids");
        }
        match (&self.problem, bounds.is_empty()) {
            (None, _) if self.hierarchies.iter().any(|h| h.unified) && !self.clone_into => {
                format!(
                    "cgroup per call ({}; joined by cgroup.procs, clone3 is refused here: a call after a pause waits for the kernel, about 10 ms)",
                    bounds.join(", ")
                )
            }
            (None, _) => format!("cgroup per call ({})", bounds.join(", ")),
            (Some(p), true) => format!(
                "no cgroup ({p}): process-tree kill by the call's supervisor, max_memory per process, processes per user (not for root)"
            ),
            (Some(p), false) => format!(
                "cgroup per call ({}) but {p}: the rest per process",
                bounds.join(", ")
            ),
        }
    }

    /// The cgroups of one call, limits written, open for the program's process to join:
    /// ones a finished call left empty where there are, else new ones. A failure leaves
    /// the call to its supervisor and rlimits (logged, not fatal).
    pub fn for_call(&self, limits: CallLimits) -> Option<CallCgroup> {
        if self.hierarchies.is_empty() {
            return None;
        }
        let reused = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sets
            .pop();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut call = CallCgroup {
            dirs: Vec::new(),
            tasks: Vec::new(),
            unified: None,
            spare: self.spare.clone(),
        };
        for (i, h) in self.hierarchies.iter().enumerate() {
            let made = match reused.as_ref().map(|set| &set[i]) {
                Some(dir) => match enter_call_cgroup(h, dir, limits) {
                    Ok(entry) => Ok((dir.clone(), entry)),
                    Err(e) => {
                        tracing::warn!(cgroup = %dir.display(), "call cgroup not reused: {e}");
                        let _ = std::fs::remove_dir(dir);
                        new_call_cgroup(h, n, limits)
                    }
                },
                None => new_call_cgroup(h, n, limits),
            };
            match made {
                Ok((dir, Entry::Tasks(tasks))) => {
                    call.dirs.push((dir, h.unified));
                    call.tasks.push(tasks);
                }
                Ok((dir, Entry::Unified(dir_fd, procs))) => {
                    call.dirs.push((dir, h.unified));
                    call.unified = Some((dir_fd, procs));
                }
                Err((dir, e)) => {
                    tracing::warn!(base = %h.base.display(), cgroup = %dir.display(), "call cgroup not made: {e}");
                    if !dir.as_os_str().is_empty() {
                        let _ = std::fs::remove_dir(&dir);
                    }
                }
            }
        }
        // Only a whole set is kept for reuse.
        if call.dirs.len() < self.hierarchies.len() {
            call.spare = Arc::new(Mutex::new(Spare {
                sets: Vec::new(),
                closed: true,
            }));
        }
        Some(call)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        spare.closed = true;
        for dir in spare.sets.drain(..).flatten() {
            let _ = std::fs::remove_dir(dir);
        }
        for h in &self.hierarchies {
            let _ = std::fs::remove_dir(&h.base);
        }
    }
}

/// Removes the `vaultd-PID` cgroups of vaultd processes that are gone (a cgroup dir is
/// removed by `rmdir` once empty; one still holding processes stays).
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        // `vaultd-PID`, or a test's `vaultd-NAME-PID`.
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("vaultd-"))
            .and_then(|p| p.rsplit('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(calls) = std::fs::read_dir(entry.path()) {
            for call in calls.flatten().filter(|c| c.path().is_dir()) {
                let _ = std::fs::remove_dir(call.path());
            }
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// How the program's process gets into one hierarchy's call cgroup
/// ([`super::supervise::CgroupJoin`]).
enum Entry {
    /// v1: the `tasks` file.
    Tasks(OwnedFd),
    /// v2: the directory (born inside by clone3), and `cgroup.procs` where clone3 is refused.
    Unified(OwnedFd, OwnedFd),
}

/// Makes call cgroup `call-n` in `h` and enters it.
fn new_call_cgroup(
    h: &Hierarchy,
    n: u64,
    limits: CallLimits,
) -> Result<(PathBuf, Entry), (PathBuf, std::io::Error)> {
    let dir = h.base.join(format!("call-{n}"));
    if let Err(e) = std::fs::create_dir(&dir) {
        // Not made here: not ours to remove.
        return Err((PathBuf::new(), e));
    }
    match enter_call_cgroup(h, &dir, limits) {
        Ok(entry) => Ok((dir, entry)),
        Err(e) => Err((dir, e)),
    }
}

/// Writes this call's limits into an existing, empty call cgroup `dir` and opens it for
/// the program's process to join.
fn enter_call_cgroup(h: &Hierarchy, dir: &Path, limits: CallLimits) -> std::io::Result<Entry> {
    // The program and what it starts; the supervisor stays outside.
    let processes = limits.processes.to_string();
    let memory = limits.memory.to_string();
    if h.unified {
        if h.memory {
            write_file(&dir.join("memory.max"), &memory)?;
            // No swap: the limit is memory, not memory plus as much swap as there is.
            let _ = write_file(&dir.join("memory.swap.max"), "0");
        }
        if h.pids {
            write_file(&dir.join("pids.max"), &processes)?;
        }
    } else {
        if h.memory {
            // memory + swap may never be below memory: raising both (a reused cgroup), the
            // first write of memsw is the one that counts, lowering both, the last.
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            let _ = write_file(&memsw, &memory);
            write_file(&dir.join("memory.limit_in_bytes"), &memory)?;
            // Without swap accounting there is no such file; where there is, a reused
            // cgroup must not keep a higher one.
            if memsw.exists() {
                write_file(&memsw, &memory)?;
            }
        }
        if h.pids {
            write_file(&dir.join("pids.max"), &processes)?;
        }
    }
    let open = |name: &str| -> std::io::Result<OwnedFd> {
        Ok(OpenOptions::new().write(true).open(dir.join(name))?.into())
    };
    if h.unified {
        let dir_fd = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)?;
        Ok(Entry::Unified(dir_fd.into(), open("cgroup.procs")?))
    } else {
        Ok(Entry::Tasks(open("tasks")?))
    }
}

fn write_file(path: &Path, value: &str) -> std::io::Result<()> {
    OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// v2: the controllers this cgroup's parent offers, enabled for the call cgroups below it.
fn enable_controllers(base: &Path) -> (bool, bool) {
    let offered = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let mut enabled = (false, false);
    for (name, slot) in [("memory", &mut enabled.0), ("pids", &mut enabled.1)] {
        if offered.split_whitespace().any(|c| c == name) {
            *slot = write_file(&base.join("cgroup.subtree_control"), &format!("+{name}")).is_ok();
        }
    }
    enabled
}

/// vaultd's own path in the hierarchy: `0::/path` for v2, `N:ctrl,ctrl:/path` for v1.
fn own_path<'a>(own: &'a str, unified: bool, options: &[&str]) -> Option<&'a str> {
    own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if unified {
            controllers.is_empty()
        } else {
            !controllers.is_empty() && controllers.split(',').all(|c| options.contains(&c))
        };
        matches.then_some(path)
    })
}

/// A cgroup mount line of /proc/self/mountinfo.
struct Mount<'a> {
    root: &'a str,
    point: &'a str,
    fstype: &'a str,
    options: Vec<&'a str>,
}

impl<'a> Mount<'a> {
    /// "36 25 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
    fn parse(line: &'a str) -> Option<Mount<'a>> {
        let (before, after) = line.split_once(" - ")?;
        let fields: Vec<&str> = before.split(' ').collect();
        let mut after = after.split(' ');
        let fstype = after.next()?;
        if fstype != "cgroup" && fstype != "cgroup2" {
            return None;
        }
        let _source = after.next()?;
        let options = after.next().unwrap_or("").split(',').collect();
        Some(Mount {
            root: fields.get(3).copied()?,
            point: fields.get(4).copied()?,
            fstype,
            options,
        })
    }
}

/// One call's cgroups: joined by the program's process, killed and removed when the call ends.
///
/// Dropping it ends it: what is left in the cgroups is killed and, once the kernel sees
/// them empty, they are kept for the next call (or removed). This waits (a bounded time):
/// drop it off the call's path.
#[derive(Debug)]
pub struct CallCgroup {
    dirs: Vec<(PathBuf, bool)>,
    /// v1 `tasks` files.
    tasks: Vec<OwnedFd>,
    /// The v2 cgroup's directory and `cgroup.procs`.
    unified: Option<(OwnedFd, OwnedFd)>,
    /// Where the emptied cgroups go (a closed one where they cannot be reused).
    spare: Arc<Mutex<Spare>>,
}

impl CallCgroup {
    /// How the program's process joins these cgroups (fds that stay open with `self`).
    pub fn join(&self) -> CgroupJoin {
        CgroupJoin {
            tasks: self.tasks.iter().map(AsRawFd::as_raw_fd).collect(),
            unified: self
                .unified
                .as_ref()
                .map(|(dir, procs)| (dir.as_raw_fd(), procs.as_raw_fd())),
        }
    }

    /// Kills what is left in the cgroups (the supervisor normally left nothing), waits a
    /// bounded time for the kernel to see them empty, then keeps them for the next call or
    /// removes them.
    pub fn end(self) {
        drop(self);
    }

    fn empty(&self) -> bool {
        self.dirs.iter().all(|(dir, _)| {
            std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty())
        })
    }

    /// Whether a process is still counted against `pids.max` though none is listed: one
    /// that exited and was not reaped yet (its supervisor may be stopped, or still at it).
    fn charged(&self) -> bool {
        self.dirs.iter().any(
            |(dir, _)| match std::fs::read_to_string(dir.join("pids.current")) {
                Ok(n) => n.trim() != "0",
                Err(e) => e.kind() != std::io::ErrorKind::NotFound,
            },
        )
    }

    fn finish(&mut self) {
        self.tasks.clear();
        self.unified = None;
        // Killed only if something is left: a v2 cgroup whose `cgroup.kill` was ever
        // written kills what is later born into it with CLONE_INTO_CGROUP (Linux 6.18
        // compares the kill count of the parent's cgroup with the new one's), so a killed
        // cgroup is never reused.
        // Reused only when nothing is listed and nothing is counted: a process not yet
        // reaped would count against the next call's pids.max.
        let mut killed = false;
        for tries in 0.. {
            let empty = self.empty();
            if empty && !self.charged() {
                if killed {
                    break;
                }
                let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
                if !spare.closed && spare.sets.len() < MAX_SPARE {
                    spare
                        .sets
                        .push(self.dirs.drain(..).map(|(dir, _)| dir).collect());
                    return;
                }
                break;
            }
            if tries > 200 {
                break;
            }
            if !empty {
                self.kill();
                killed = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for (dir, _) in &self.dirs {
            if let Err(e) = std::fs::remove_dir(dir) {
                tracing::warn!(cgroup = %dir.display(), "call cgroup not removed: {e}");
            }
        }
    }

    fn kill(&self) {
        for (dir, unified) in &self.dirs {
            if *unified && write_file(&dir.join("cgroup.kill"), "1").is_ok() {
                continue;
            }
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }
}

impl Drop for CallCgroup {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::sandbox::supervise::{Program, REFUSE_CLONE3, control_pipe, split};
    use std::os::unix::process::CommandExt;

    /// The program's process is in every one of its call's cgroups (so is everything it
    /// starts), its supervisor in none; in cgroup v2 it was born there by clone3: the
    /// `cgroup.procs` fallback is handed a descriptor that cannot be written, and the
    /// program still runs. Skipped, saying so, where no cgroup can be made.
    #[test]
    fn the_program_joins_every_call_cgroup_without_cgroup_procs() {
        let cgroups = Cgroups::discover_as(&format!("vaultd-test-{}", std::process::id()));
        if cgroups.hierarchies.is_empty() {
            eprintln!("skipped: no cgroup here: {}", cgroups.describe());
            return;
        }
        // Twice: the second call reuses the first one's cgroups.
        for _ in 0..2 {
            join_and_run(&cgroups, true);
        }
    }

    /// A cgroup whose process exited but was not reaped yet (listed nowhere, still counted
    /// in `pids.current`) is not handed to the next call: it would start one process short.
    #[test]
    fn a_cgroup_still_counting_an_unreaped_process_is_not_reused() {
        let cgroups = Cgroups::discover_as(&format!("vaultd-unreaped-{}", std::process::id()));
        if !cgroups.bounds_processes() {
            eprintln!("skipped: no pids cgroup here: {}", cgroups.describe());
            return;
        }
        let call = cgroups
            .for_call(CallLimits {
                memory: 1 << 30,
                processes: 4,
            })
            .unwrap();
        let first: Vec<PathBuf> = call.dirs.iter().map(|(d, _)| d.clone()).collect();
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let (pids_dir, _) = cgroups
            .hierarchies
            .iter()
            .zip(&call.dirs)
            .find(|(h, _)| h.pids)
            .map(|(_, d)| d)
            .unwrap();
        std::fs::write(pids_dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        // Exited, not reaped: a zombie.
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(call.charged(), "pids.current counts the zombie");
        call.end();
        child.wait().unwrap();
        let next = cgroups.for_call(CallLimits {
            memory: 1 << 30,
            processes: 4,
        });
        let again: Vec<PathBuf> = next.unwrap().dirs.iter().map(|(d, _)| d.clone()).collect();
        assert_ne!(again, first, "not reused");
    }

    /// Where clone3 is refused (a seccomp policy), the program's process writes itself to
    /// the v2 `cgroup.procs`, and is in every call cgroup all the same.
    #[test]
    fn where_clone3_is_refused_the_program_joins_by_cgroup_procs() {
        let cgroups = Cgroups::discover_as(&format!("vaultd-refused-{}", std::process::id()));
        if !cgroups.hierarchies.iter().any(|h| h.unified) {
            eprintln!("skipped: no cgroup v2 here: {}", cgroups.describe());
            return;
        }
        REFUSE_CLONE3.set(true);
        join_and_run(&cgroups, false);
        REFUSE_CLONE3.set(false);
    }

    /// Runs a program in a call's cgroups, `born_inside` the v2 one (its `cgroup.procs`
    /// fallback is then handed a descriptor that cannot be written), and checks it is in
    /// each of them and its supervisor in none.
    fn join_and_run(cgroups: &Cgroups, born_inside: bool) {
        let call = cgroups
            .for_call(CallLimits {
                memory: 1 << 30,
                processes: 16,
            })
            .unwrap();
        assert_eq!(call.dirs.len(), cgroups.hierarchies.len(), "{call:?}");
        let mut join = call.join();
        let unreadable = std::fs::File::open("/dev/null").unwrap();
        if let Some((dir, _)) = join.unified
            && born_inside
        {
            join.unified = Some((dir, unreadable.as_raw_fd()));
        }
        let program = Program::new(
            std::ffi::OsStr::new("sh"),
            std::ffi::OsStr::new("sh"),
            [
                "-c",
                "cat /proc/self/cgroup; echo supervisor; cat /proc/$PPID/cgroup",
            ],
            [("PATH", "/usr/bin:/bin")],
        )
        .unwrap();
        let (control_read, control_write) = control_pipe().unwrap();
        let control = control_read.as_raw_fd();
        let mut cmd = std::process::Command::new("/nonexistent/never-run-by-std");
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // SAFETY: `split` makes only system calls; the entry does nothing.
        unsafe {
            cmd.pre_exec(move || Err(split(control, &join, &program, &mut || Ok(()))));
        }
        let child = cmd.spawn();
        drop(control_read);
        let out = child.unwrap().wait_with_output().unwrap();
        drop(control_write);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let (program_lines, supervisor_lines) = stdout.split_once("supervisor\n").unwrap();
        for (h, (dir, _)) in cgroups.hierarchies.iter().zip(&call.dirs) {
            let name = dir.strip_prefix(&h.base).unwrap();
            let name = format!("/{}", h.base.file_name().unwrap().to_str().unwrap())
                + "/"
                + name.to_str().unwrap();
            let controller = if h.memory { "memory" } else { "pids" };
            let line = program_lines
                .lines()
                .find(|l| {
                    let controllers = l.split(':').nth(1).unwrap_or_default();
                    if h.unified {
                        controllers.is_empty()
                    } else {
                        controllers.split(',').any(|c| c == controller)
                    }
                })
                .unwrap_or_else(|| panic!("{dir:?} not in {program_lines}"));
            assert!(line.ends_with(&name), "{line} for {dir:?}");
        }
        assert!(!supervisor_lines.contains("/call-"), "{supervisor_lines}");
        call.end();
    }

    /// A finished call's cgroups, once empty, are the next call's, with that call's limits,
    /// lower or higher (v1 refuses memory above memory + swap: the order of the writes);
    /// removed with vaultd's own.
    #[test]
    fn a_finished_calls_cgroups_are_the_next_calls_with_its_limits() {
        let cgroups = Cgroups::discover_as(&format!("vaultd-reuse-{}", std::process::id()));
        if cgroups.hierarchies.is_empty() {
            eprintln!("skipped: no cgroup here: {}", cgroups.describe());
            return;
        }
        let limits = |memory: u64, processes: u64| CallLimits { memory, processes };
        let read = |call: &CallCgroup| -> Vec<String> {
            let mut values = Vec::new();
            for (h, (dir, _)) in cgroups.hierarchies.iter().zip(&call.dirs) {
                let files: &[&str] = match (h.unified, h.memory, h.pids) {
                    (true, m, p) => &[
                        if m { "memory.max" } else { "" },
                        if p { "pids.max" } else { "" },
                    ],
                    (false, m, p) => &[
                        if m { "memory.limit_in_bytes" } else { "" },
                        if p { "pids.max" } else { "" },
                    ],
                };
                for f in files.iter().filter(|f| !f.is_empty()) {
                    values.push(
                        std::fs::read_to_string(dir.join(f))
                            .unwrap()
                            .trim()
                            .to_string(),
                    );
                }
            }
            values
        };
        let first = cgroups.for_call(limits(256 << 20, 8)).unwrap();
        let dirs: Vec<PathBuf> = first.dirs.iter().map(|(d, _)| d.clone()).collect();
        assert!(
            read(&first).iter().all(|v| v == "268435456" || v == "8"),
            "{:?}",
            read(&first)
        );
        first.end();
        for (memory, processes) in [(128u64 << 20, 4u64), (1 << 30, 32)] {
            let next = cgroups.for_call(limits(memory, processes)).unwrap();
            let again: Vec<PathBuf> = next.dirs.iter().map(|(d, _)| d.clone()).collect();
            assert_eq!(again, dirs, "reused");
            let values = read(&next);
            assert!(
                values
                    .iter()
                    .all(|v| *v == memory.to_string() || *v == processes.to_string()),
                "{values:?}"
            );
            next.end();
        }
        drop(cgroups);
        assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
    }

    #[test]
    fn mounts_and_own_paths_are_read_for_both_versions() {
        let m = Mount::parse(
            "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
        )
        .unwrap();
        assert_eq!(
            (m.root, m.point, m.fstype),
            ("/", "/sys/fs/cgroup/memory", "cgroup")
        );
        assert!(m.options.contains(&"memory"));
        assert!(Mount::parse("23 1 0:21 / /proc rw - proc proc rw").is_none());
        let own = "4:memory:/a/b\n1:cpu,cpuacct:/c\n0::/user.slice/x.service\n";
        assert_eq!(own_path(own, false, &["rw", "memory"]), Some("/a/b"));
        assert_eq!(own_path(own, true, &[]), Some("/user.slice/x.service"));
        assert_eq!(own_path(own, false, &["rw", "pids"]), None);
    }
}
