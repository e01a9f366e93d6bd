//! Tests: what to do at a point of the daemon's work on one note, named by its file name
//! (tests name their notes apart), each hook run once.

use std::path::Path;
use std::sync::Mutex;

pub(crate) struct OnceHooks<H>(Mutex<Vec<(String, H)>>);

impl<H> OnceHooks<H> {
    pub(crate) const fn new() -> OnceHooks<H> {
        OnceHooks(Mutex::new(Vec::new()))
    }

    pub(crate) fn set(&self, file_name: &str, hook: H) {
        self.lock().push((file_name.to_string(), hook));
    }

    /// The hook set for the note at `path` (by its file name), taken out.
    pub(crate) fn take(&self, path: &Path) -> Option<H> {
        let name = path.file_name().and_then(|n| n.to_str())?;
        let mut hooks = self.lock();
        let i = hooks.iter().position(|(n, _)| n == name)?;
        Some(hooks.remove(i).1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, H)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
