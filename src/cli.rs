//! The command line (placeholder until the CLI lands).

pub fn main() -> i32 {
    0
}
