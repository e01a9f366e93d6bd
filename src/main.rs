fn main() {
    std::process::exit(vaultd::cli::main());
}
