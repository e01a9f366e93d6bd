//! Synced vaults (docs/design.md §9.9): this daemon's runner id, and spotting notes that another
//! runner — a vaultd on a replica of the vault, brought here by a sync client — has claimed or
//! finished. Pure parts take text and times; the scan reads only notes changed inside the
//! window, so start-up on a large `Done/` costs one `stat` per old note.

use crate::recent::Recent;
use crate::vault::{State, Vault};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The file in the state dir that keeps this daemon's runner id across restarts.
pub const RUNNER_ID_FILE: &str = "runner_id";

/// `tool_runner`: host name plus 4 hex digits of a random id. Stored whole in the state dir
/// at first start, so it stays the same across restarts and across container re-creations
/// that keep the state dir (a container's host name may change; the id does not), and two
/// state dirs on one host get two ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerId(String);

impl RunnerId {
    /// Reads the id kept in `state_dir`, or makes one (mode 0600) on first start.
    pub fn load_or_create(state_dir: &Path) -> std::io::Result<RunnerId> {
        let path = state_dir.join(RUNNER_ID_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) if is_valid_runner(text.trim()) => return Ok(RunnerId(text.trim().into())),
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{} does not hold a runner id (host-xxxx); remove it to make a new one",
                        path.display()
                    ),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let id = RunnerId(format!("{}-{}", runner_host(&hostname()), random_hex4()?));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        if let Err(e) = &file
            && e.kind() == std::io::ErrorKind::AlreadyExists
        {
            // Another process made it first: theirs wins.
            return RunnerId::load_or_create(state_dir);
        }
        use std::io::Write;
        let f = file
            .as_mut()
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?;
        writeln!(f, "{}", id.0)?;
        f.sync_all()?;
        Ok(id)
    }

    /// The id kept in `state_dir`, without making one (for `vaultd status`).
    pub fn load(state_dir: &Path) -> Option<RunnerId> {
        let text = std::fs::read_to_string(state_dir.join(RUNNER_ID_FILE)).ok()?;
        RunnerId::parse(text.trim())
    }

    pub fn parse(s: &str) -> Option<RunnerId> {
        is_valid_runner(s).then(|| RunnerId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The host part, for messages ("second runner on HOST").
    pub fn host(&self) -> &str {
        host_of(&self.0)
    }
}

impl std::fmt::Display for RunnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The host part of a `tool_runner` value.
pub fn host_of(runner: &str) -> &str {
    runner.rsplit_once('-').map_or(runner, |(host, _)| host)
}

fn is_valid_runner(s: &str) -> bool {
    let Some((host, hex)) = s.rsplit_once('-') else {
        return false;
    };
    !host.is_empty()
        && host.len() <= 64
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        && hex.len() == 4
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A host name as it may stand in a one-line YAML value: anything else becomes `-`.
fn runner_host(host: &str) -> String {
    let clean: String = host
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if clean.is_empty() {
        "host".to_string()
    } else {
        clean
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

fn random_hex4() -> std::io::Result<String> {
    let mut bytes = [0u8; 2];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!("{:02x}{:02x}", bytes[0], bytes[1]))
}

/// What a note's frontmatter says about who ran it last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerStamp {
    pub runner: String,
    /// `tool_updated`, when present and readable.
    pub updated: Option<SystemTime>,
}

/// `tool_runner` and `tool_updated` of a note's frontmatter; None without a `tool_runner`.
/// `text` may be only the note's first bytes ([`read_head`]): a frontmatter cut short there
/// is read as far as it goes.
pub fn runner_stamp(text: &str) -> Option<RunnerStamp> {
    use crate::note::frontmatter::head_property;
    Some(RunnerStamp {
        runner: head_property(text, "tool_runner")?.to_string(),
        updated: head_property(text, "tool_updated")
            .and_then(|v| humantime::parse_rfc3339_weak(v).ok()),
    })
}

/// Whether a stamp is another runner's activity that counts: not ours, updated inside the
/// window, and after the last take-over (whose notes are history).
pub fn is_foreign_activity(
    stamp: &RunnerStamp,
    me: &RunnerId,
    window: Duration,
    taken_over_at: Option<SystemTime>,
    now: SystemTime,
) -> bool {
    if stamp.runner == me.as_str() {
        return false;
    }
    let Some(updated) = stamp.updated else {
        return false;
    };
    let recent = now
        .duration_since(updated)
        .map_or(true, |age| age <= window);
    recent && taken_over_at.is_none_or(|t| updated > t)
}

/// A note another runner worked on recently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignNote {
    pub path: PathBuf,
    pub runner: String,
    pub updated: SystemTime,
}

/// A note whose frontmatter carries a `tool_runner`, as the start-up scan found it.
#[derive(Debug, Clone)]
pub struct StampedNote {
    pub path: PathBuf,
    pub state: State,
    pub modified: SystemTime,
    /// The stamp in the note's first [`HEAD_BYTES`], decoded lossily: what §9.9 reads.
    pub head: Option<RunnerStamp>,
    /// The stamp of the whole note when it was read whole ([`ScanRead::Whole`]) and is UTF-8:
    /// what §9.12 reads (a note that is not UTF-8 is never run).
    pub whole: Option<RunnerStamp>,
}

/// How much of a note the start-up scan reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanRead {
    Skip,
    Head,
    Whole,
}

/// How much of a note the second-runner checks read: its frontmatter is at the top.
pub const HEAD_BYTES: usize = 64 * 1024;

/// The start-up scan of every state folder, shared by the checks of docs/design.md §9.9 (another
/// runner's recent notes: their heads) and §9.12 (notes stamped here, with a journal that knows
/// none: every note whole, a long frontmatter's `tool_runner` may stand past any head): each
/// regular file of at most `max_bytes` is read once, as much of it as `wanted` says by its
/// folder and mtime. Returns the notes with a `tool_runner`, in scan order (state by state,
/// as [`State::ALL`] lists them).
pub fn stamped_notes(
    vault: &Vault,
    max_bytes: u64,
    wanted: impl Fn(State, SystemTime) -> ScanRead + Sync,
) -> Vec<StampedNote> {
    let judge = |(state, path): &(State, PathBuf)| {
        let meta = std::fs::symlink_metadata(path).ok()?;
        let modified = meta.modified().ok()?;
        if !meta.is_file() || meta.len() > max_bytes {
            return None;
        }
        let (head, whole) = match wanted(*state, modified) {
            ScanRead::Skip => return None,
            ScanRead::Head => (runner_stamp(&read_head(path).ok()?), None),
            ScanRead::Whole => {
                let bytes = crate::files::read_regular(path).ok()?;
                let head = &bytes[..bytes.len().min(HEAD_BYTES)];
                (
                    runner_stamp(&String::from_utf8_lossy(head)),
                    std::str::from_utf8(&bytes).ok().and_then(runner_stamp),
                )
            }
        };
        if head.is_none() && whole.is_none() {
            return None;
        }
        Some(StampedNote {
            path: path.clone(),
            state: *state,
            modified,
            head,
            whole,
        })
    };
    let paths: Vec<(State, PathBuf)> = State::ALL
        .into_iter()
        .flat_map(|s| vault.scan(s).into_iter().map(move |p| (s, p)))
        .collect();
    // Before the first claim, every wanted note is opened and read: on a backlog of
    // thousands that is the larger part of the start-up, shared out over the cores.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let chunk = paths.len().div_ceil(threads).max(FOREIGN_SCAN_CHUNK);
    let judge = &judge;
    std::thread::scope(|scope| {
        let parts: Vec<_> = paths
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().filter_map(judge).collect::<Vec<_>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|part| part.join().expect("the scan of a note does not panic"))
            .collect()
    })
}

/// The oldest mtime a note of another runner's recent activity can have here: a note another
/// runner updated recently was written recently here too, whatever the sync client did with
/// its mtime after that (clients keep it or set it to the arrival).
pub fn recent_since(window: Duration, now: SystemTime) -> SystemTime {
    now.checked_sub(window).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Of the scanned notes, those whose `tool_runner` is another's and whose `tool_updated` is
/// inside `window` (and after the last take-over), their files changed inside the window.
pub fn foreign_among(
    scanned: &[StampedNote],
    me: &RunnerId,
    window: Duration,
    taken_over_at: Option<SystemTime>,
    now: SystemTime,
) -> Vec<ForeignNote> {
    let oldest = recent_since(window, now);
    scanned
        .iter()
        .filter(|n| n.modified >= oldest)
        .filter_map(|n| foreign_of(&n.path, n.head.as_ref()?, me, window, taken_over_at, now))
        .collect()
}

/// Fewer notes than this are scanned by one thread: a thread's start costs more than they do.
const FOREIGN_SCAN_CHUNK: usize = 256;

/// One note, read and judged (for events while running).
pub fn foreign_note(
    path: &Path,
    me: &RunnerId,
    window: Duration,
    taken_over_at: Option<SystemTime>,
    now: SystemTime,
) -> Option<ForeignNote> {
    let stamp = runner_stamp(&read_head(path).ok()?)?;
    foreign_of(path, &stamp, me, window, taken_over_at, now)
}

fn foreign_of(
    path: &Path,
    stamp: &RunnerStamp,
    me: &RunnerId,
    window: Duration,
    taken_over_at: Option<SystemTime>,
    now: SystemTime,
) -> Option<ForeignNote> {
    if !is_foreign_activity(stamp, me, window, taken_over_at, now) {
        return None;
    }
    Some(ForeignNote {
        path: path.to_path_buf(),
        runner: stamp.runner.clone(),
        updated: stamp.updated?,
    })
}

/// The names sync clients and file managers give a copy of `NAME.md`, in one place
/// (docs/design.md §9.10; docs/reliability.md lists them). Each is a suffix of the copy's stem:
///
/// | suffix | made by |
/// |---|---|
/// | ` 2`, ` 3`, … | iCloud Drive, macOS (a second file of one name) |
/// | ` 1`, ` 2`, … | Obsidian "Duplicate file" / "Make a copy" |
/// | ` (1)`, ` (2)`, … | Google Drive, Dropbox, OneDrive (web), Windows |
/// | ` copy`, ` copy 2` | macOS Finder "Duplicate" |
/// | ` - Copy`, ` - Copy (2)` | Windows Explorer |
/// | ` (SFConflict EMAIL DATE-TIME)` | Seafile |
/// | `-conflict…`, `_conflict-…`, ` conflict…`, `.Conflict` | ownCloud, generic, Resilio |
/// | `-HOST`, `-HOST-2` (everything after a `-`) | OneDrive "keep both" (`NAME-DESKTOP-ABC12`) |
///
/// Syncthing's `.sync-conflict-` and Dropbox's / Nextcloud's `conflicted copy` names are not
/// here: those are never claimed at all (`vault::is_ignored`).
///
/// Returns the stems `NAME` that `stem` may be a copy of, most specific first, at most
/// [`MAX_DUPLICATE_ORIGINALS`]. Broad on purpose (`-HOST` strips any `-` suffix): a name
/// alone never makes a copy; the journal must also hold a recent claim of `NAME.md` in the
/// same folder whose text as claimed equals this note's byte for byte.
pub fn duplicate_originals(stem: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |s: &str| {
        let s = s.trim_end();
        if !s.is_empty() && s != stem && !out.iter().any(|o| o == s) {
            out.push(s.to_string());
        }
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
    // ` (…)` at the end: ` (1)`, conflicted copies, Seafile.
    if let Some(open) = stem.rfind(" (")
        && let Some(inner) = stem[open + 2..].strip_suffix(')')
    {
        if digits(inner) || inner.starts_with("SFConflict ") {
            add(&stem[..open]);
        }
        // Windows ` - Copy (2)`.
        if digits(inner)
            && let Some(base) = stem[..open].strip_suffix(" - Copy")
        {
            add(base);
        }
    }
    if let Some(base) = stem.strip_suffix(" - Copy") {
        add(base);
    }
    // ` 2` (iCloud, Obsidian), ` copy`, ` copy 2` (Finder).
    if let Some((base, n)) = stem.rsplit_once(' ')
        && digits(n)
    {
        add(base.strip_suffix(" copy").unwrap_or(base));
    }
    if let Some(base) = stem.strip_suffix(" copy") {
        add(base);
    }
    // ownCloud, Resilio and other `conflict` markers.
    let lower = stem.to_ascii_lowercase();
    for marker in ["-conflict", "_conflict", " conflict", ".conflict"] {
        if let Some(at) = lower.rfind(marker) {
            add(&stem[..at]);
        }
    }
    // OneDrive `NAME-HOST`: host names hold `-` too, so every `-` is a candidate.
    for (at, _) in stem
        .match_indices('-')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        add(&stem[..at]);
    }
    out.truncate(MAX_DUPLICATE_ORIGINALS);
    out
}

/// At most this many names are looked up in the journal for one note: a name with many `-`
/// costs no more than this.
pub const MAX_DUPLICATE_ORIGINALS: usize = 8;

/// How long a path this daemon just wrote or moved into counts as its own: the watcher's
/// event for it comes within milliseconds; a later event there is someone else's.
const OWN_WRITE_TTL: Duration = Duration::from_secs(5);

/// What [`RunnerWatch::check`] needs, owned: it reads a note, on a blocking thread.
#[derive(Clone)]
pub struct ForeignCheck {
    me: RunnerId,
    window: Duration,
    taken_over_at: Option<SystemTime>,
}

impl ForeignCheck {
    /// Reads the head of the note at `path`: another runner's recent activity, or None.
    pub fn check(&self, path: &Path) -> Option<ForeignNote> {
        foreign_note(
            path,
            &self.me,
            self.window,
            self.taken_over_at,
            SystemTime::now(),
        )
    }
}

/// A running daemon's view of other runners (docs/design.md §9.9): the take-over cutoff, the pause,
/// and the paths it just wrote itself, whose events need no read at all.
pub struct RunnerWatch {
    pub me: RunnerId,
    window: Duration,
    taken_over_at: Option<SystemTime>,
    /// The note that showed a second runner; claiming stays paused until a restart.
    paused: Mutex<Option<ForeignNote>>,
    /// Paths this daemon just claimed, wrote or moved a note to, and when.
    own: OwnWrites,
}

/// The paths this daemon just claimed, wrote or moved a note to: shared with the watcher's
/// thread, which drops their events before they wake the daemon, and with the blocking pool,
/// which notes a path before its rename so that the rename's event finds it noted.
#[derive(Clone)]
pub struct OwnWrites(Arc<Mutex<Recent>>);

impl OwnWrites {
    /// Notes that this daemon puts, or just put, a note at `path`.
    pub fn wrote(&self, path: &Path) {
        self.0.lock().expect("own-writes lock poisoned").note(path);
    }

    /// `path` is not this daemon's own (a rename noted before it was made failed, or put the
    /// note under another name).
    pub fn forget(&self, path: &Path) {
        self.0.lock().expect("own-writes lock poisoned").take(path);
    }

    /// Whether an event at `path` is (very likely) this daemon's own write.
    pub fn just_wrote(&self, path: &Path) -> bool {
        self.0
            .lock()
            .expect("own-writes lock poisoned")
            .age(path)
            .is_some()
    }
}

impl RunnerWatch {
    pub fn new(me: RunnerId, window: Duration, taken_over_at: Option<SystemTime>) -> RunnerWatch {
        RunnerWatch {
            me,
            window,
            taken_over_at,
            paused: Mutex::new(None),
            own: OwnWrites(Arc::new(Mutex::new(Recent::new(OWN_WRITE_TTL)))),
        }
    }

    /// The record of this daemon's own writes, for the watcher's thread and the blocking pool.
    pub fn own(&self) -> OwnWrites {
        self.own.clone()
    }

    /// Notes that this daemon put `path` there (a claim, a results write, a move).
    pub fn wrote(&self, path: &Path) {
        self.own.wrote(path);
    }

    /// Whether an event at `path` is (very likely) this daemon's own write.
    pub fn just_wrote(&self, path: &Path) -> bool {
        self.own.just_wrote(path)
    }

    /// Reads the head of the note at `path`: another runner's recent activity, or None.
    pub fn check(&self, path: &Path) -> Option<ForeignNote> {
        self.checker().check(path)
    }

    /// [`check`](Self::check), for a blocking thread.
    pub fn checker(&self) -> ForeignCheck {
        ForeignCheck {
            me: self.me.clone(),
            window: self.window,
            taken_over_at: self.taken_over_at,
        }
    }

    /// Pauses claiming because of `note`; true the first time (the caller then logs and alerts
    /// once).
    pub fn pause(&self, note: ForeignNote) -> bool {
        let mut paused = self.paused.lock().expect("pause lock poisoned");
        if paused.is_some() {
            return false;
        }
        *paused = Some(note);
        true
    }

    pub fn is_paused(&self) -> bool {
        self.paused.lock().expect("pause lock poisoned").is_some()
    }
}

/// How a paused daemon is resumed, for the log, the alert and `vaultd status`.
pub fn how_to_resume(host: &str) -> String {
    format!(
        "stop vaultd on {host} (or this one), then restart the one that should run the vault with `vaultd run --take-over`"
    )
}

/// Why start-up stops (docs/design.md §9.9): names the other runner, its newest note, and the two
/// ways out.
pub fn refusal(found: &[ForeignNote], vault: &Vault, window: Duration) -> String {
    let newest = found
        .iter()
        .max_by_key(|f| f.updated)
        .expect("a refusal names at least one note");
    let mut runners: Vec<&str> = found.iter().map(|f| f.runner.as_str()).collect();
    runners.sort_unstable();
    runners.dedup();
    let others = if found.len() > 1 {
        format!(" (and {} more of its notes)", found.len() - 1)
    } else {
        String::new()
    };
    // §9.14: a date ahead of our clock is said to be one; `--take-over` makes it history too.
    let now = SystemTime::now();
    let future = if newest.updated > now {
        format!(
            " (a date in the future: this machine's clock says {}; one of the two clocks is wrong, or the date was written by hand)",
            humantime::format_rfc3339_seconds(now)
        )
    } else {
        String::new()
    };
    format!(
        "a second runner works on this vault: {note} was updated at {at}{future} by vaultd {runner} on host {host}{others}, within runner_window = {window} (a replica of this vault, kept in sync, has its own vaultd; two daemons would send every call twice). Either stop vaultd on {host} and let the sync settle, then start this one again; or, if {host} is gone for good, start this one with `vaultd run --take-over` (or `vaultd once --take-over`): notes {runners} updated up to now are then history",
        note = vault.relative(&newest.path),
        at = humantime::format_rfc3339_seconds(newest.updated),
        runner = newest.runner,
        host = host_of(&newest.runner),
        window = humantime::format_duration(window),
        runners = runners.join(", "),
    )
}

/// The first 64 KiB of a note: the frontmatter is at the top, and a note is never trusted to
/// be small.
fn read_head(path: &Path) -> std::io::Result<String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let mut buf = Vec::with_capacity(4096);
    file.take(HEAD_BYTES as u64).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Folders;

    fn me() -> RunnerId {
        RunnerId::parse("alpha-0a1b").unwrap()
    }

    fn note(runner: &str, updated: &str) -> String {
        format!(
            "---\ntitle: x\ntool_status: done\ntool_runner: {runner}\ntool_updated: {updated}\n---\nbody\n"
        )
    }

    #[test]
    fn runner_id_is_made_once_kept_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = RunnerId::load_or_create(dir.path()).unwrap();
        let b = RunnerId::load_or_create(dir.path()).unwrap();
        assert_eq!(a, b);
        assert!(is_valid_runner(a.as_str()), "{a}");
        assert_eq!(a.host(), runner_host(&hostname()));
        let mode = std::fs::metadata(dir.path().join(RUNNER_ID_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Another state dir is another runner (with overwhelming likelihood; retry a few
        // times so a 1-in-65,536 clash cannot fail the test).
        let distinct = (0..5).any(|_| {
            let other = tempfile::tempdir().unwrap();
            RunnerId::load_or_create(other.path()).unwrap() != a
        });
        assert!(distinct);
    }

    #[test]
    fn a_damaged_runner_id_file_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(RUNNER_ID_FILE), "not an id\n").unwrap();
        let e = RunnerId::load_or_create(dir.path()).unwrap_err();
        assert!(e.to_string().contains("remove it"), "{e}");
    }

    #[test]
    fn host_names_are_made_safe_for_one_yaml_line() {
        assert_eq!(runner_host("web-1.example.org"), "web-1.example.org");
        assert_eq!(runner_host("bad host: x\n"), "bad-host--x-");
        assert_eq!(runner_host(""), "host");
        assert_eq!(host_of("my-host-01-beef"), "my-host-01");
    }

    #[test]
    fn stamp_reads_runner_and_updated_from_the_frontmatter_only() {
        let s = runner_stamp(&note("beta-1234", "2026-11-20T10:00:00Z")).unwrap();
        assert_eq!(s.runner, "beta-1234");
        assert_eq!(
            s.updated,
            Some(humantime::parse_rfc3339("2026-11-20T10:00:00Z").unwrap())
        );
        assert_eq!(
            runner_stamp("\u{feff}---\r\ntool_runner: \"q-beef\"\r\n---\r\n")
                .unwrap()
                .runner,
            "q-beef"
        );
        assert_eq!(runner_stamp("no frontmatter\ntool_runner: x-1234\n"), None);
        assert_eq!(
            runner_stamp("---\ntitle: a\n---\ntool_runner: x-1234\n"),
            None
        );
    }

    #[test]
    fn foreign_activity_needs_another_runner_inside_the_window_after_any_take_over() {
        let now = humantime::parse_rfc3339("2026-11-23T12:00:00Z").unwrap();
        let day = Duration::from_secs(86_400);
        let stamp = |runner: &str, at: &str| RunnerStamp {
            runner: runner.into(),
            updated: Some(humantime::parse_rfc3339(at).unwrap()),
        };
        let other_recent = stamp("beta-1234", "2026-11-23T11:00:00Z");
        assert!(is_foreign_activity(&other_recent, &me(), day, None, now));
        assert!(!is_foreign_activity(
            &stamp("alpha-0a1b", "2026-11-23T11:00:00Z"),
            &me(),
            day,
            None,
            now
        ));
        assert!(!is_foreign_activity(
            &stamp("beta-1234", "2026-11-21T11:00:00Z"),
            &me(),
            day,
            None,
            now
        ));
        let taken = humantime::parse_rfc3339("2026-11-23T11:30:00Z").unwrap();
        assert!(!is_foreign_activity(
            &other_recent,
            &me(),
            day,
            Some(taken),
            now
        ));
        let after = stamp("beta-1234", "2026-11-23T11:45:00Z");
        assert!(is_foreign_activity(&after, &me(), day, Some(taken), now));
    }

    /// A prepared vault for the scan tests, now, and a `tool_updated` a minute before it.
    fn scan_vault() -> (tempfile::TempDir, Vault, SystemTime, String) {
        let dir = tempfile::tempdir().unwrap();
        let vault = Vault::new(dir.path().to_path_buf(), Folders::default());
        vault.prepare().unwrap();
        let now = SystemTime::now();
        let recent = humantime::format_rfc3339_seconds(now - Duration::from_secs(60)).to_string();
        (dir, vault, now, recent)
    }

    /// The start-up scan as `run_vault` makes it for §9.9 alone, with a window of a day.
    fn scan_a_day(vault: &Vault, now: SystemTime) -> Vec<ForeignNote> {
        let day = Duration::from_secs(86_400);
        let oldest = recent_since(day, now);
        let scanned = stamped_notes(vault, 1 << 20, |_, modified| {
            if modified >= oldest {
                ScanRead::Head
            } else {
                ScanRead::Skip
            }
        });
        foreign_among(&scanned, &me(), day, None, now)
    }

    #[test]
    fn the_scan_finds_recent_foreign_notes_in_every_state_folder_and_skips_old_files() {
        let (_dir, vault, now, recent) = scan_vault();
        std::fs::write(
            vault.folder(State::Done).join("theirs.md"),
            note("beta-1234", &recent),
        )
        .unwrap();
        std::fs::write(
            vault.folder(State::InProgress).join("mine.md"),
            note("alpha-0a1b", &recent),
        )
        .unwrap();
        // A foreign note whose file is old is not read at all (the mtime filter).
        let old = vault.folder(State::Failed).join("old.md");
        std::fs::write(&old, note("beta-1234", &recent)).unwrap();
        let f = std::fs::File::options().write(true).open(&old).unwrap();
        f.set_modified(now - Duration::from_secs(3 * 86_400))
            .unwrap();
        let found = scan_a_day(&vault, now);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].path.ends_with("Done/theirs.md"));
        assert_eq!(found[0].runner, "beta-1234");
    }

    #[test]
    fn a_scan_shared_out_over_threads_finds_every_foreign_note_in_order() {
        let (_dir, vault, now, recent) = scan_vault();
        let n = FOREIGN_SCAN_CHUNK * 3 + 7;
        let theirs = [5, FOREIGN_SCAN_CHUNK + 1, n - 1];
        for i in 0..n {
            let runner = if theirs.contains(&i) {
                "beta-1234"
            } else {
                "alpha-0a1b"
            };
            std::fs::write(
                vault.folder(State::Done).join(format!("n{i:05}.md")),
                note(runner, &recent),
            )
            .unwrap();
        }
        let found = scan_a_day(&vault, now);
        let names: Vec<String> = found
            .iter()
            .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let expected: Vec<String> = theirs.iter().map(|i| format!("n{i:05}.md")).collect();
        assert_eq!(names, expected);
    }

    #[test]
    fn duplicate_names_of_sync_clients_lead_back_to_the_original() {
        let cases = [
            ("Round3 2", "Round3"),          // iCloud
            ("Round3 1", "Round3"),          // Obsidian duplicate
            ("Round3 (1)", "Round3"),        // Google Drive
            ("Round3 copy", "Round3"),       // Finder
            ("Round3 copy 2", "Round3"),     // Finder
            ("Round3 - Copy", "Round3"),     // Windows
            ("Round3 - Copy (2)", "Round3"), // Windows
            (
                "Round3 (SFConflict ana@example.com 2026-11-24-10-15-00)",
                "Round3",
            ), // Seafile
            ("Round3.Conflict", "Round3"),   // Resilio
            ("Round3-conflict-20261124", "Round3"), // generic
            ("Round3_conflict-20261124-101500", "Round3"), // ownCloud
            ("Round3-DESKTOP-AB12CD", "Round3"), // OneDrive
            ("Round3-laptop", "Round3"),     // OneDrive
            ("Round3-laptop-2", "Round3"),   // OneDrive
            ("my-note 2", "my-note"),
        ];
        for (copy, original) in cases {
            let found = duplicate_originals(copy);
            assert!(found.iter().any(|o| o == original), "{copy}: {found:?}");
        }
    }

    #[test]
    fn a_plain_name_has_no_original_and_candidates_are_bounded() {
        assert!(duplicate_originals("Round3").is_empty());
        // A name alone is only a candidate: the journal must hold `Round.md` claimed with
        // this very text.
        assert_eq!(duplicate_originals("Round 3"), ["Round"]);
        assert!(duplicate_originals(" 2").is_empty());
        let many = "a-".repeat(500) + "b";
        assert!(duplicate_originals(&many).len() <= MAX_DUPLICATE_ORIGINALS);
        assert!(!duplicate_originals("x (1)").contains(&"x (1)".to_string()));
    }
}
