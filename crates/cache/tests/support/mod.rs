//! Power-loss helpers shared by the cache's integration tests: what the disk holds after a
//! sync, and putting it back as a power loss would.

/// The data files of a cache directory with their bytes (what the disk holds).
pub fn data_files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with("data.") || n == "clean.data"
        })
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    v.sort();
    v
}

/// Power loss: every data file goes back to the bytes (and length) it had at `snapshot`; the
/// WAL keeps everything written out (the kernel may write a WAL page back before the data
/// pages it points at); the machine reboots (another boot id).
pub fn power_loss(dir: &std::path::Path, snapshot: &[(std::path::PathBuf, Vec<u8>)]) {
    for (p, bytes) in snapshot {
        std::fs::write(p, bytes).unwrap();
    }
    std::fs::write(dir.join("boot_id"), "a-boot-before-the-power-loss\n").unwrap();
}
