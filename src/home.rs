//! `~` in paths a person writes (config values, `file:` secret references): the one place the
//! home directory is looked up. Config and secrets both use it; it uses neither.

use std::path::PathBuf;

/// Expands a leading `~/` (or a lone `~`) to the home directory; other paths are unchanged.
pub fn expand_tilde(p: &str) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/")
        && let Some(home) = directories::BaseDirs::new()
    {
        return home.home_dir().join(rest);
    }
    if p == "~"
        && let Some(home) = directories::BaseDirs::new()
    {
        return home.home_dir().to_path_buf();
    }
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_leading_tilde_is_the_home_directory() {
        let home = directories::BaseDirs::new().expect("a home directory");
        assert_eq!(expand_tilde("~/a/b"), home.home_dir().join("a/b"));
        assert_eq!(expand_tilde("~"), home.home_dir());
        assert_eq!(expand_tilde("/x/~/y"), PathBuf::from("/x/~/y"));
        assert_eq!(expand_tilde("~other/x"), PathBuf::from("~other/x"));
    }
}
