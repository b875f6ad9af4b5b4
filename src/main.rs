//! The `vramfit` command line: `vramfit --help`.
fn main() -> std::process::ExitCode {
    vramfit::cli::main(vramfit::cli::App { open: vramfit::gui::run, bench_ui: vramfit::gui::bench_ui_report })
}
