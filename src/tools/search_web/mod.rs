//! `search_web` (read_only): one query to the configured provider, mapped to
//! `{ "results": [ { "title", "url", "snippet" } ] }`.

use crate::config::SearchWebConfig;
use crate::tools::{Effect, Tool, ToolCall, ToolFuture, ToolSpec};
use serde_json::json;

pub struct SearchWeb {
    spec: ToolSpec,
    #[allow(dead_code)]
    config: SearchWebConfig,
    #[allow(dead_code)]
    http: reqwest::Client,
}

impl SearchWeb {
    pub fn new(config: &SearchWebConfig, http: reqwest::Client) -> SearchWeb {
        SearchWeb {
            spec: ToolSpec {
                name: "search_web",
                description: "Search the web and return the top results (title, url, snippet).",
                effect: Effect::ReadOnly,
                schema: json!({
                    "type": "object",
                    "properties": {
                        "query": { "type": "string", "minLength": 1, "maxLength": 500,
                                   "description": "What to search for." },
                        "num_results": { "type": "integer", "minimum": 1, "maximum": 20, "default": 5,
                                         "description": "How many results to return (default 5)." }
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            },
            config: config.clone(),
            http,
        }
    }
}

impl Tool for SearchWeb {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(&'a self, _call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move { todo!("search_web providers") })
    }
}
