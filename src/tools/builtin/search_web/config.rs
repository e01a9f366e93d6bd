//! `[tools.search_web]`: the table as written (serde: `provider` an enum, `timeout` a
//! humantime duration, unknown keys refused) and its validation into [`SearchWebConfig`],
//! with the secrets it names and what `vaultd config` shows of it.

use crate::config::table::{ConfigError, RateLimit, RawRateLimit, TableContext};
use crate::secret::{Secret, SecretHolder};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

const KEY: &str = "tools.search_web";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_RATE_LIMIT: RateLimit = RateLimit {
    per_hour: Some(120),
    per_day: Some(1000),
};

/// `[tools.search_web]` exactly as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSearchWeb {
    pub enabled: Option<bool>,
    pub provider: Option<SearchProvider>,
    pub base_url: Option<String>,
    /// A secret reference (`env:BRAVE_API_KEY`).
    pub api_key: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub rate_limit: Option<RawRateLimit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchProvider {
    /// No key needed: the default.
    #[default]
    DuckDuckGo,
    Searxng,
    Brave,
    Tavily,
}

impl SearchProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            SearchProvider::DuckDuckGo => "duckduckgo",
            SearchProvider::Searxng => "searxng",
            SearchProvider::Brave => "brave",
            SearchProvider::Tavily => "tavily",
        }
    }
}

/// `search_web`'s settings, validated and with the API key resolved.
#[derive(Debug, Clone)]
pub struct SearchWebConfig {
    pub enabled: bool,
    pub provider: SearchProvider,
    /// None = the provider's public default.
    pub base_url: Option<String>,
    pub api_key: Option<Secret>,
    pub timeout: Duration,
    pub rate_limit: RateLimit,
}

impl SearchWebConfig {
    pub fn from_raw(raw: RawSearchWeb, cx: &TableContext) -> Result<SearchWebConfig, ConfigError> {
        if let Some(url) = &raw.base_url
            && reqwest::Url::parse(url).is_err()
        {
            return Err(cx.invalid(&format!("{KEY}.base_url"), format!("`{url}` is not a URL")));
        }
        let api_key = match &raw.api_key {
            Some(r) => Some(cx.secret(&format!("{KEY}.api_key"), r)?),
            None => None,
        };
        Ok(SearchWebConfig {
            enabled: raw.enabled.unwrap_or(true),
            provider: raw.provider.unwrap_or_default(),
            base_url: raw.base_url,
            api_key,
            timeout: raw.timeout.unwrap_or(DEFAULT_TIMEOUT),
            rate_limit: RateLimit::from_raw(raw.rate_limit, DEFAULT_RATE_LIMIT),
        })
    }

    /// What `vaultd config` shows: the key as its reference only.
    pub fn describe(&self) -> Value {
        json!({
            "enabled": self.enabled,
            "provider": self.provider.as_str(),
            "base_url": self.base_url,
            "api_key": self.api_key.as_ref().map(|k| format!("{} [redacted]", k.reference())),
            "timeout": humantime::format_duration(self.timeout).to_string(),
            "rate_limit": self.rate_limit.describe(),
        })
    }
}

impl SecretHolder for SearchWebConfig {
    fn secrets(&self) -> Vec<&Secret> {
        self.api_key.iter().collect()
    }
}
