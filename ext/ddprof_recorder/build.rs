fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Emits the cfgs and link arguments rb-sys needs for the Ruby it builds against (the one
    // named by RUBY, else the first on PATH).
    let env = rb_sys_env::activate()?;
    // rerun-if lines (build.rs, RUBY and the DEP_RB_* variables): without any, cargo reruns
    // this script, and so relinks the crate, whenever a file under ext/ddprof_recorder
    // changes, such as the Makefile and the library that `gem install` writes there.
    env.print_cargo_rerun_if_changed();
    Ok(())
}
