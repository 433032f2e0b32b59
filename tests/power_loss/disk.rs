//! The simulated disk of `common::power_disk` keeps what was flushed and loses the rest at a cut:
//! fsync and syncfs on its ext4 reach it as flushes, each kind of cut loses what it should, and
//! ext4 comes back consistent. Skips with a printed sentence where the disk cannot run (not root,
//! no FUSE, no loop device), except under `HOARD_TEST_REQUIRE_POWER_LOSS=1`, where that fails.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::power_disk::PowerDisk;
use crate::common::random_bytes;

const BLOCK: usize = 4096;

fn disk_or_skip() -> Option<PowerDisk> {
    let started = Instant::now();
    match PowerDisk::new() {
        Ok(disk) => {
            eprintln!(
                "power disk on {} ready in {:?}",
                disk.device().unwrap(),
                started.elapsed()
            );
            Some(disk)
        }
        Err(why) => {
            let required = std::env::var("HOARD_TEST_REQUIRE_POWER_LOSS").as_deref() == Ok("1");
            assert!(
                !required,
                "the power-loss disk is required here (HOARD_TEST_REQUIRE_POWER_LOSS=1), but {why}"
            );
            eprintln!("skipped: this test needs the power-loss disk, but {why}");
            None
        }
    }
}

/// Writes `data` to a new file at `path`, with an fsync of the file and of its directory when
/// `sync`.
fn write_file(path: &Path, data: &[u8], sync: bool) {
    let mut file = File::create(path).unwrap();
    file.write_all(data).unwrap();
    if sync {
        file.sync_all().unwrap();
        File::open(path.parent().unwrap())
            .unwrap()
            .sync_all()
            .unwrap();
    }
}

/// A file that must have survived, with `data`.
fn assert_kept(path: &Path, data: &[u8]) {
    let found = std::fs::read(path).unwrap();
    assert!(
        found == data,
        "{} has {} bytes, not the {} written before the cut",
        path.display(),
        found.len(),
        data.len()
    );
}

/// A file that must not have survived: absent, or without the bytes written to it.
fn assert_lost(path: &Path, data: &[u8]) {
    match std::fs::read(path) {
        Ok(found) => assert!(found != data, "{} survived the cut", path.display()),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}"),
    }
}

/// A directory of the test's own on the disk, made durable.
fn test_dir(disk: &PowerDisk) -> std::path::PathBuf {
    let dir = disk.path().join("test");
    std::fs::create_dir(&dir).unwrap();
    File::open(disk.path()).unwrap().sync_all().unwrap();
    dir
}

#[test]
fn a_cut_keeps_fsynced_files_and_loses_the_rest() {
    let Some(disk) = disk_or_skip() else { return };
    let dir = test_dir(&disk);
    let (a, b) = (random_bytes(300_000, 1), random_bytes(200_000, 2));

    let (flushes, writes) = (disk.flushes(), disk.writes());
    write_file(&dir.join("a"), &a, true);
    eprintln!(
        "writing and fsyncing a new 300 kB file and its directory: {} flushes, {} writes",
        disk.flushes() - flushes,
        disk.writes() - writes
    );
    assert!(disk.flushes() > flushes, "fsync never reached the disk");
    write_file(&dir.join("b"), &b, false);

    disk.cut_now();
    assert!(disk.is_cut());
    // The dying file system goes on without errors; its writes are dropped.
    write_file(&dir.join("after"), b"after the cut", true);
    let started = Instant::now();
    disk.power_on().unwrap();
    eprintln!("power_on took {:?}", started.elapsed());
    assert!(!disk.is_cut());

    assert_kept(&dir.join("a"), &a);
    assert_lost(&dir.join("b"), &b);
    assert_lost(&dir.join("after"), b"after the cut");
    disk.check_consistent().unwrap();

    // And the disk works on after the reboot.
    write_file(&dir.join("b"), &b, true);
    disk.power_on().unwrap();
    assert_kept(&dir.join("b"), &b);
}

#[test]
fn a_cut_at_a_flush_loses_what_that_flush_would_have_kept() {
    let Some(disk) = disk_or_skip() else { return };
    let dir = test_dir(&disk);
    let (c, d) = (random_bytes(100_000, 3), random_bytes(100_000, 4));

    write_file(&dir.join("c"), &c, false);
    let flushes = disk.flushes();
    rustix::fs::syncfs(File::open(disk.path()).unwrap()).unwrap();
    let syncfs_flushes = disk.flushes() - flushes;
    eprintln!("syncfs after writing a 100 kB file: {syncfs_flushes} flushes");
    assert!(syncfs_flushes >= 1, "syncfs never reached the disk");

    write_file(&dir.join("d"), &d, false);
    disk.cut_at_flush(1);
    assert!(!disk.is_cut());
    // The fsync succeeds: the disk lies, as a disk whose power is gone cannot answer.
    File::open(dir.join("d")).unwrap().sync_all().unwrap();
    assert!(disk.wait_until_cut(Duration::from_secs(10)));
    disk.power_on().unwrap();

    assert_kept(&dir.join("c"), &c);
    assert_lost(&dir.join("d"), &d);
    disk.check_consistent().unwrap();
}

#[test]
fn a_cut_after_writes_loses_a_written_but_unflushed_overwrite() {
    let Some(disk) = disk_or_skip() else { return };
    let dir = test_dir(&disk);
    let e = random_bytes(50_000, 5);
    let path = dir.join("e");
    write_file(&path, &e, true);

    // An overwrite in place and fdatasync: ext4 writes the data block, then flushes. The cut is
    // armed once the block is in the page cache, so that only the fdatasync's writes count.
    let new = random_bytes(BLOCK, 6);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&new, 0).unwrap();
    let (flushes, writes) = (disk.flushes(), disk.writes());
    disk.cut_after_writes(1);
    file.sync_data().unwrap();
    drop(file);
    assert!(disk.wait_until_cut(Duration::from_secs(10)));
    eprintln!(
        "overwriting 4 KiB in place and fdatasync: {} writes, {} flushes",
        disk.writes() - writes,
        disk.flushes() - flushes
    );
    // The dying file system reads what it wrote, from the disk's cache.
    assert!(
        read_direct(&path, BLOCK) == new,
        "the dying file system reads other bytes"
    );
    disk.power_on().unwrap();

    // The write reached the disk but no flush made it durable: the old bytes are back.
    assert_kept(&path, &e);
    disk.check_consistent().unwrap();
}

/// The first `len` bytes of `path`, read with `O_DIRECT`: from the disk, not the page cache.
fn read_direct(path: &Path, len: usize) -> Vec<u8> {
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECT,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    // O_DIRECT needs a buffer aligned to the block size.
    let mut buf = vec![0u8; len + BLOCK];
    let skip = buf.as_ptr().align_offset(BLOCK);
    let aligned = &mut buf[skip..skip + len];
    let read = rustix::io::pread(&fd, &mut *aligned, 0).unwrap();
    assert_eq!(read, len);
    aligned.to_vec()
}
