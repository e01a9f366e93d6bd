//! A Bash command split into its simple commands, for the `Bash(…)` rules: `git status && rm x`
//! is two commands, each judged on its own. The split reads `'…'`, `"…"` and `\` as the shell
//! does; what it does not read with confidence can only be asked about, never allowed.

/// One simple command of a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// As written, trimmed: what allow rules match.
    pub text: String,
    /// Its words with the quotes removed and without redirections, leading `VAR=value`
    /// assignments, shell keywords (`{`, `if`, `then`, …) and wrappers (`sudo`, `env`, …):
    /// the command deny and ask rules also look at.
    pub words: Vec<String>,
    /// It contains a command or process substitution or a redirection.
    pub risky: bool,
}

/// A command line, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub parts: Vec<Part>,
    /// False when the line could not be read with confidence (an unbalanced quote or
    /// parenthesis, a trailing `\`, `$'…'`): the parts are then a best effort.
    pub confident: bool,
}

pub fn split(command: &str) -> Split {
    let mut parser = Parser {
        chars: command.chars().collect(),
        i: 0,
        confident: true,
        parts: Vec::new(),
    };
    parser.list(false);
    Split {
        parts: parser.parts,
        confident: parser.confident,
    }
}

struct Parser {
    chars: Vec<char>,
    i: usize,
    confident: bool,
    parts: Vec<Part>,
}

/// The simple command being read.
struct Current {
    start: usize,
    words: Vec<String>,
    word: String,
    in_word: bool,
    risky: bool,
    /// The next word is a redirection's target, not part of the command.
    skip_word: bool,
}

impl Current {
    fn new(start: usize) -> Current {
        Current {
            start,
            words: Vec::new(),
            word: String::new(),
            in_word: false,
            risky: false,
            skip_word: false,
        }
    }

    fn push(&mut self, c: char) {
        self.word.push(c);
        self.in_word = true;
    }

    fn end_word(&mut self) {
        if !self.in_word {
            return;
        }
        let word = std::mem::take(&mut self.word);
        if std::mem::take(&mut self.skip_word) {
            // A redirection's target.
        } else {
            self.words.push(word);
        }
        self.in_word = false;
    }
}

/// Words before the command that do not change which command runs.
const KEYWORDS: &[&str] = &[
    "!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "time",
    "exec", "command", "builtin", "nohup", "sudo", "env", "nice",
];

fn is_assignment(word: &str) -> bool {
    let Some((name, _)) = word.split_once('=') else {
        return false;
    };
    let name = name.strip_suffix('+').unwrap_or(name);
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Parser {
    fn at(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }

    /// Ends the simple command read so far at `self.i` (the operator's position).
    fn finish(&mut self, cur: &mut Current) {
        cur.end_word();
        let text: String = self.chars[cur.start..self.i].iter().collect();
        let text = text.trim();
        if !text.is_empty() {
            let mut words = std::mem::take(&mut cur.words);
            let lead = words
                .iter()
                .take_while(|w| is_assignment(w) || KEYWORDS.contains(&w.as_str()))
                .count();
            words.drain(..lead);
            self.parts.push(Part {
                text: text.to_string(),
                words,
                risky: cur.risky,
            });
        }
    }

    /// Reads simple commands up to the end, or, `nested` in `$(…)` or `<(…)`, up to its `)`,
    /// which it consumes.
    fn list(&mut self, nested: bool) {
        let mut cur = Current::new(self.i);
        let mut depth = 0usize;
        while let Some(c) = self.at(self.i) {
            let next = self.at(self.i + 1);
            match c {
                ' ' | '\t' => {
                    cur.end_word();
                    self.i += 1;
                }
                ';' | '\n' | '&' | '|' | '(' | ')' => {
                    if c == '&' && next == Some('>') {
                        // `&>file`, `&>>file`: a redirection.
                        cur.end_word();
                        self.i += 1;
                        self.redirection(&mut cur);
                        continue;
                    }
                    if c == ')' && depth == 0 && nested {
                        self.finish(&mut cur);
                        self.i += 1;
                        return;
                    }
                    self.finish(&mut cur);
                    match c {
                        '(' => depth += 1,
                        ')' if depth > 0 => depth -= 1,
                        ')' => self.confident = false,
                        _ => {}
                    }
                    self.i += 1;
                    // `&&`, `||`, `|&`
                    if matches!((c, self.at(self.i)), ('&', Some('&')) | ('|', Some('|' | '&'))) {
                        self.i += 1;
                    }
                    cur = Current::new(self.i);
                }
                '>' | '<' => {
                    // `2>file`: the digits name a descriptor.
                    if cur.in_word && !cur.word.is_empty() && cur.word.chars().all(|c| c.is_ascii_digit()) {
                        cur.word.clear();
                        cur.in_word = false;
                    } else {
                        cur.end_word();
                    }
                    self.redirection(&mut cur);
                }
                '$' if next == Some('(') => {
                    cur.risky = true;
                    cur.push('$');
                    self.i += 2;
                    self.list(true);
                }
                '$' if next == Some('\'') => {
                    // `$'…'` has escapes of its own.
                    self.confident = false;
                    cur.push('$');
                    self.i += 1;
                }
                '`' => {
                    cur.risky = true;
                    cur.push('$');
                    self.backticks();
                }
                '\\' => match next {
                    Some('\n') => self.i += 2,
                    Some(n) => {
                        cur.push(n);
                        self.i += 2;
                    }
                    None => {
                        self.confident = false;
                        self.i += 1;
                    }
                },
                '\'' => self.single_quoted(&mut cur),
                '"' => self.double_quoted(&mut cur),
                c => {
                    cur.push(c);
                    self.i += 1;
                }
            }
        }
        if nested || depth > 0 {
            self.confident = false;
        }
        self.finish(&mut cur);
    }

    /// At `'`: the quoted text, as written, up to the closing `'`.
    fn single_quoted(&mut self, cur: &mut Current) {
        cur.in_word = true;
        self.i += 1;
        loop {
            match self.at(self.i) {
                None => {
                    self.confident = false;
                    break;
                }
                Some('\'') => {
                    self.i += 1;
                    break;
                }
                Some(c) => {
                    cur.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// At `"`: the quoted text up to the closing `"`, its escapes read and its
    /// substitutions split on their own.
    fn double_quoted(&mut self, cur: &mut Current) {
        cur.in_word = true;
        self.i += 1;
        loop {
            let Some(c) = self.at(self.i) else {
                self.confident = false;
                break;
            };
            let next = self.at(self.i + 1);
            match c {
                '"' => {
                    self.i += 1;
                    break;
                }
                '\\' if matches!(next, Some('$' | '`' | '"' | '\\' | '\n')) => {
                    if next != Some('\n') {
                        cur.push(next.unwrap_or_default());
                    }
                    self.i += 2;
                }
                '$' if next == Some('(') => {
                    cur.risky = true;
                    cur.push('$');
                    self.i += 2;
                    self.list(true);
                }
                '`' => {
                    cur.risky = true;
                    cur.push('$');
                    self.backticks();
                }
                c => {
                    cur.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// At `>` or `<`: a redirection, a here-document or a process substitution.
    fn redirection(&mut self, cur: &mut Current) {
        cur.risky = true;
        self.i += 1;
        if self.at(self.i) == Some('(') {
            // `<(…)`, `>(…)`
            self.i += 1;
            self.list(true);
            return;
        }
        while matches!(self.at(self.i), Some('>' | '<' | '&' | '|' | '-')) {
            self.i += 1;
        }
        cur.skip_word = true;
    }

    /// At a backtick: the command up to the next one, split on its own.
    fn backticks(&mut self) {
        self.i += 1;
        let mut inner = String::new();
        loop {
            match self.at(self.i) {
                None => {
                    self.confident = false;
                    break;
                }
                Some('`') => {
                    self.i += 1;
                    break;
                }
                Some('\\') if self.at(self.i + 1).is_some() => {
                    let n = self.at(self.i + 1).unwrap_or_default();
                    if !matches!(n, '`' | '\\' | '$') {
                        inner.push('\\');
                    }
                    inner.push(n);
                    self.i += 2;
                }
                Some(c) => {
                    inner.push(c);
                    self.i += 1;
                }
            }
        }
        let Split { parts, confident } = split(&inner);
        self.parts.extend(parts);
        self.confident &= confident;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(command: &str) -> (Vec<(String, bool)>, bool) {
        let s = split(command);
        (
            s.parts.into_iter().map(|p| (p.text, p.risky)).collect(),
            s.confident,
        )
    }

    #[test]
    fn operators_split_and_quotes_do_not() {
        let (parts, ok) = texts("a 1 && b \"x; y\" || c 'p|q' ; d & e | f\ng");
        assert!(ok);
        let names: Vec<_> = parts.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(names, ["a 1", "b \"x; y\"", "c 'p|q'", "d", "e", "f", "g"]);
        assert!(parts.iter().all(|(_, risky)| !risky));
    }

    #[test]
    fn substitutions_are_split_too_and_mark_their_command() {
        let s = split("echo \"$(rm -rf x; ls)\" `id` 2>&1");
        assert!(s.confident);
        let t: Vec<_> = s.parts.iter().map(|p| (p.text.as_str(), p.risky)).collect();
        assert_eq!(
            t,
            [
                ("rm -rf x", false),
                ("ls", false),
                ("id", false),
                ("echo \"$(rm -rf x; ls)\" `id` 2>&1", true)
            ]
        );
    }

    #[test]
    fn words_lose_quotes_assignments_keywords_and_redirections() {
        let s = split(">out FOO=\"a b\" sudo 'r'm -rf 2>/dev/null /x");
        assert_eq!(s.parts[0].words, ["rm", "-rf", "/x"]);
    }

    #[test]
    fn what_cannot_be_read_is_not_confident() {
        for c in ["a 'b", "a \"b", "a \\", "a $'b'", "a $(b", "a `b", "a )", "(a"] {
            assert!(!split(c).confident, "{c:?}");
        }
    }
}
