fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Emits the cfgs and link arguments rb-sys needs for the Ruby found on PATH.
    let _ = rb_sys_env::activate()?;
    Ok(())
}
