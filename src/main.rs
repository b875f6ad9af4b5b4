//! The `vramfit` command line: `vramfit --help`.
fn main() -> std::process::ExitCode {
    vramfit::cli::main()
}
