//! An ext4 file system on a simulated disk that loses power on command, for tests of what
//! survives a power cut.
//!
//! # The model
//!
//! The disk has a volatile write cache, as real disks do. A write lands in the cache; a flush
//! (the block layer's cache flush, and a FUA write, which the block layer turns into a write
//! and a flush here) makes every write taken before it durable. A power cut loses the cache
//! whole: what was flushed stays, what was written since the last flush is gone, none of it
//! half-kept. That is the harshest outcome a real disk may give (it may also keep some cached
//! writes, in any order), so a program that survives it has ordered its fsyncs correctly.
//!
//! From the instant of a cut the disk is dead: a flush no longer makes anything durable, and a
//! write is answered with success and dropped, so the dying file system goes on without errors
//! and without changing what survives. Reads still see what they saw (the cache over the durable
//! blocks), so the dying file system reads no garbage. [`PowerDisk::power_on`] is the reboot:
//! it unmounts the dead file system (whatever it writes back is dropped), throws the cache away,
//! and mounts again, so ext4 replays its journal from exactly the durable blocks. The mount then
//! shows what a real machine shows after that power loss.
//!
//! A cut comes at once ([`PowerDisk::cut_now`]), when the n-th flush from now arrives and before
//! it is applied ([`PowerDisk::cut_at_flush`]: a cut in the middle of an fsync or a syncfs), or
//! right after the n-th write from now is taken ([`PowerDisk::cut_after_writes`]). A cut is
//! atomic with respect to the disk's requests: each request is wholly before or wholly after it.
//!
//! # How
//!
//! A FUSE daemon on a thread of the test process (the `fuser` crate, mounted with mount(2), as
//! root) serves one sparse file, `disk.img`, and keeps the disk's blocks in memory. A FUSE
//! `fsync` of that file is the disk's flush. `losetup` attaches the file to a loop device, whose
//! driver turns every block-layer flush into an fsync of its backing file; ext4 is made and
//! mounted on the loop device, and that ext4 is the file system the test uses. The file is
//! opened with `FOPEN_DIRECT_IO`, so the kernel keeps no page cache of it: after a cut nothing
//! stale is read back from memory. The remount in `power_on` also drops the loop device's own
//! cache.
//!
//! The test's files are not on the FUSE file system itself because a FUSE daemon never hears of
//! a `syncfs` (only virtiofs forwards it), and a file system's own caching of FUSE files is not
//! a disk's: the loop device and ext4 give the real kernel paths of fsync, syncfs, the journal
//! and its replay, over a disk whose cache the test controls.
//!
//! Needs root, `/dev/fuse`, the loop driver, and `losetup`, `mkfs.ext4`, `mount` and `umount`
//! (`e2fsck` for [`PowerDisk::check_consistent`]); [`PowerDisk::new`] says in a sentence what is
//! missing, so a test can skip.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, LockOwner, MountOption,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite,
    Request, WriteFlags,
};

/// The simulated disk's size: 1 GiB, of which only the written blocks take memory.
pub const DISK_SIZE: u64 = 1024 * 1024 * 1024;

/// The unit the disk keeps its contents in.
const BLOCK: usize = 4096;

const IMAGE_NAME: &str = "disk.img";
const IMAGE_INO: INodeNo = INodeNo(2);

/// `fallocate` modes that zero a range (`FALLOC_FL_PUNCH_HOLE`, `FALLOC_FL_ZERO_RANGE`): the
/// loop driver's discard and write-zeroes.
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// ext4 as mounted: `noinit_itable` keeps the kernel's background inode-table zeroing (of a disk
/// that is all zeros already) from writing while a test counts writes.
const MOUNT_OPTIONS: &str = "noinit_itable";

/// An ext4 file system at [`PowerDisk::path`] on a disk whose power the test cuts.
///
/// Everything takes `&self`, so one `Arc<PowerDisk>` may be shared with a thread that cuts.
/// Dropping it unmounts the file system and detaches and removes the disk, best effort.
pub struct PowerDisk {
    disk: Arc<Shared>,
    tools: Tools,
    /// Holds `fuse/` (where `disk.img` is served) and `ext4/` (the mount the test uses). Kept
    /// (leaked) rather than deleted if something is still mounted below it at drop.
    dir: Option<tempfile::TempDir>,
    fuse_dir: PathBuf,
    mount_dir: PathBuf,
    image: PathBuf,
    session: Option<fuser::BackgroundSession>,
    attached: Mutex<Attached>,
}

/// The loop device and the ext4 mount, as they are now.
#[derive(Default)]
struct Attached {
    /// `/dev/loopN`, while `disk.img` is attached.
    device: Option<String>,
    mounted: bool,
}

impl PowerDisk {
    /// Serves a fresh, zeroed disk, makes ext4 on it and mounts it at [`PowerDisk::path`].
    ///
    /// Err, with a sentence saying why, where this machine cannot: not root, no `/dev/fuse`, a
    /// tool missing, or a mount refused (a container without the rights, say).
    pub fn new() -> Result<PowerDisk, String> {
        if !rustix::process::geteuid().is_root() {
            return Err(
                "the power-loss disk needs root (it mounts FUSE, ext4 and a loop device)"
                    .to_owned(),
            );
        }
        if !Path::new("/dev/fuse").exists() {
            return Err(
                "the power-loss disk needs /dev/fuse, which this machine lacks \
                        (no FUSE in the kernel, or a container that does not pass it in)"
                    .to_owned(),
            );
        }
        let tools = Tools::find()?;
        let dir = tempfile::Builder::new()
            .prefix("hoard-power-disk-")
            .tempdir()
            .map_err(|e| format!("could not make a temporary directory: {e}"))?;
        let fuse_dir = dir.path().join("fuse");
        let mount_dir = dir.path().join("ext4");
        for d in [&fuse_dir, &mount_dir] {
            std::fs::create_dir(d).map_err(|e| format!("could not create {}: {e}", d.display()))?;
        }
        let disk = Arc::new(Shared::default());
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("hoard-power-disk".to_owned()),
            MountOption::NoExec,
        ];
        config.n_threads = Some(1);
        let session = fuser::spawn_mount(
            DiskFs {
                disk: Arc::clone(&disk),
            },
            &fuse_dir,
            &config,
        )
        .map_err(|e| {
            format!(
                "could not mount the FUSE file system that serves the disk at {}: {e} (as \
                 root, fuser mounts with mount(2) and tries fusermount only if that is refused, \
                 as in a container without CAP_SYS_ADMIN)",
                fuse_dir.display()
            )
        })?;
        share(&tools.mount, &fuse_dir)?;
        let image = fuse_dir.join(IMAGE_NAME);
        // From here on, Drop cleans up whatever a failed step leaves.
        let this = PowerDisk {
            disk,
            tools,
            dir: Some(dir),
            fuse_dir,
            mount_dir,
            image,
            session: Some(session),
            attached: Mutex::new(Attached::default()),
        };
        {
            let mut attached = this.attached();
            let device = this.attach(&mut attached)?;
            // A fresh disk is all zeros, so nothing needs zeroing: lazy inode tables and journal,
            // and no discard (each would only write zeros).
            run(
                &this.tools.mkfs_ext4,
                &[
                    "-q",
                    "-F",
                    "-E",
                    "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                    &device,
                ],
            )?;
            this.mount(&mut attached)?;
        }
        Ok(this)
    }

    /// Where the ext4 file system is mounted: the directory the test uses. It holds
    /// `lost+found`; a test puts its files in a directory of its own below it.
    pub fn path(&self) -> &Path {
        &self.mount_dir
    }

    /// The loop device the file system is on (`/dev/loopN`), for messages. It may change at
    /// [`PowerDisk::power_on`].
    pub fn device(&self) -> Option<String> {
        self.attached().device.clone()
    }

    /// Cuts the power now. Does nothing if it is already cut.
    pub fn cut_now(&self) {
        self.disk.lock().cut(&self.disk.cut_signal);
    }

    /// Arms a cut for when the `n`-th flush from now arrives (1 is the next), before that flush
    /// makes anything durable. Replaces an earlier `cut_at_flush`.
    pub fn cut_at_flush(&self, n: u64) {
        assert!(n >= 1, "cut_at_flush counts from 1 (the next flush)");
        self.disk.lock().flushes_to_cut = Some(n);
    }

    /// Arms a cut for right after the `n`-th write request from now (1 is the next) is taken
    /// into the cache. Replaces an earlier `cut_after_writes`. A write request is one FUSE write
    /// or zeroing of `disk.img`: the loop driver splits large block writes into several.
    pub fn cut_after_writes(&self, n: u64) {
        assert!(n >= 1, "cut_after_writes counts from 1 (the next write)");
        self.disk.lock().writes_to_cut = Some(n);
    }

    /// Waits up to `timeout` for the power to be cut (an armed cut to happen); whether it is.
    pub fn wait_until_cut(&self, timeout: Duration) -> bool {
        let disk = self.disk.lock();
        let (disk, _) = self
            .disk
            .cut_signal
            .wait_timeout_while(disk, timeout, |d| !d.cut)
            .unwrap_or_else(PoisonError::into_inner);
        disk.cut
    }

    /// Whether the power is cut (and [`PowerDisk::power_on`] not yet called).
    pub fn is_cut(&self) -> bool {
        self.disk.lock().cut
    }

    /// How many flushes (FUSE fsyncs of `disk.img`) the disk has seen since it was made, before
    /// and after cuts: mkfs and the first mount included.
    pub fn flushes(&self) -> u64 {
        self.disk.lock().flushes
    }

    /// How many write requests (writes and zeroings of `disk.img`) the disk has seen since it
    /// was made, before and after cuts: mkfs and the first mount included.
    pub fn writes(&self) -> u64 {
        self.disk.lock().writes
    }

    /// Reboots after a power cut (cutting the power first if it is on): unmounts the dead file
    /// system, detaches the loop device, forgets every write that was not flushed before the cut
    /// and mounts again, which replays ext4's journal. Clears armed cuts.
    ///
    /// Call it once every process that uses the file system has gone (killed, as the power cut
    /// would have it): a file system still in use cannot be unmounted, and this then fails with
    /// a sentence saying so. It may be called again once that is fixed.
    pub fn power_on(&self) -> Result<(), String> {
        self.cut_now();
        let mut attached = self.attached();
        self.unmount(&mut attached)?;
        self.detach(&mut attached)?;
        // Nothing reaches the disk now: the lost writes can go.
        self.disk.lock().power_on();
        self.attach(&mut attached)?;
        self.mount(&mut attached)
    }

    /// Unmounts the file system cleanly (a clean shutdown: everything is written and flushed),
    /// runs `e2fsck -fn` on it and mounts it again: Err with e2fsck's report if ext4 is not
    /// consistent. The power must be on; the same rule as for [`PowerDisk::power_on`] holds for
    /// processes using it.
    pub fn check_consistent(&self) -> Result<(), String> {
        if self.is_cut() {
            return Err("check_consistent needs the power on: call power_on first".to_owned());
        }
        let e2fsck = find_tool("e2fsck", "e2fsprogs")?;
        let mut attached = self.attached();
        self.unmount(&mut attached)?;
        let device = attached
            .device
            .clone()
            .ok_or("the disk has no loop device attached")?;
        let checked = run(&e2fsck, &["-f", "-n", &device]);
        self.mount(&mut attached)?;
        checked
            .map(drop)
            .map_err(|e| format!("ext4 is not consistent: {e}"))
    }

    fn attached(&self) -> MutexGuard<'_, Attached> {
        self.attached.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Attaches `disk.img` to a free loop device; its name.
    fn attach(&self, attached: &mut Attached) -> Result<String, String> {
        let image = path_str(&self.image)?;
        let device = run(&self.tools.losetup, &["--find", "--show", image])?
            .trim()
            .to_owned();
        if !device.starts_with("/dev/") {
            return Err(format!("losetup named no device: {device:?}"));
        }
        attached.device = Some(device.clone());
        Ok(device)
    }

    fn mount(&self, attached: &mut Attached) -> Result<(), String> {
        let device = attached
            .device
            .clone()
            .ok_or("the disk has no loop device attached")?;
        run(
            &self.tools.mount,
            &[
                "-t",
                "ext4",
                "-o",
                MOUNT_OPTIONS,
                &device,
                path_str(&self.mount_dir)?,
            ],
        )
        .map_err(|e| format!("could not mount ext4 from the disk: {e}"))?;
        attached.mounted = true;
        share(&self.tools.mount, &self.mount_dir)
    }

    fn unmount(&self, attached: &mut Attached) -> Result<(), String> {
        if !attached.mounted {
            return Ok(());
        }
        // A file descriptor can outlive its closing for an instant in a child another test
        // thread is starting (between its fork and its exec): a busy mount is tried again for a
        // while before it counts as used.
        let mount_dir = path_str(&self.mount_dir)?;
        let mut tries = 0;
        let unmounted = loop {
            match run(&self.tools.umount, &[mount_dir]) {
                Err(_) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                done => break done,
            }
        };
        unmounted.map_err(|e| {
            format!(
                "could not unmount {}: a process still uses it (kill every process that uses \
                 the file system first, as the power cut would have): {e}",
                self.mount_dir.display()
            )
        })?;
        attached.mounted = false;
        Ok(())
    }

    /// Detaches the loop device and waits until the kernel has let go of it: until then the old
    /// file system could still write.
    fn detach(&self, attached: &mut Attached) -> Result<(), String> {
        let Some(device) = attached.device.clone() else {
            return Ok(());
        };
        let backing = loop_backing_file(&device);
        if backing.exists() {
            run(&self.tools.losetup, &["-d", &device])?;
        }
        // A busy loop device is only marked to detach when its last user closes it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while backing.exists() {
            if Instant::now() > deadline {
                return Err(format!(
                    "{device} is still in use after `losetup -d` (the file system is unmounted \
                     here, so a process or a mount in another mount namespace still holds it): it \
                     detaches when that goes away"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        attached.device = None;
        Ok(())
    }
}

impl Drop for PowerDisk {
    fn drop(&mut self) {
        let attached = self
            .attached
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let mount_dir = self.mount_dir.to_string_lossy().into_owned();
        // Still in use: detach it from the tree (`-l`), it goes when its last user does.
        let ext4_gone = !attached.mounted
            || run(&self.tools.umount, &[&mount_dir]).is_ok()
            || run(&self.tools.umount, &["-l", &mount_dir]).is_ok();
        if let Some(device) = attached.device.take() {
            let _ = run(&self.tools.losetup, &["-d", &device]);
            // Until the loop device lets go of disk.img, the FUSE file system is busy.
            let backing = loop_backing_file(&device);
            let deadline = Instant::now() + Duration::from_secs(5);
            while backing.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let fuse_dir = self.fuse_dir.to_string_lossy().into_owned();
        let fuse_gone = self.session.is_none()
            || run(&self.tools.umount, &[&fuse_dir]).is_ok()
            || run(&self.tools.umount, &["-l", &fuse_dir]).is_ok();
        if let Some(session) = self.session.take() {
            // The daemon thread ends once the kernel lets go of the FUSE file system, which a
            // copy of the mount in another mount namespace (made while it was mounted) delays
            // until that namespace goes: wait a little, then leave the thread to the process.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !session.guard.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if session.guard.is_finished() {
                let _ = session.join();
            }
        }
        if let Some(dir) = self.dir.take() {
            if ext4_gone && fuse_gone {
                drop(dir);
            } else {
                // Never delete recursively into something that may still be mounted.
                let kept = dir.keep();
                eprintln!("power disk: left {} behind (still mounted)", kept.display());
            }
        }
    }
}

/// The disk: its blocks and its power, shared by the FUSE daemon and the test.
#[derive(Default)]
struct Shared {
    state: Mutex<Disk>,
    /// Notified when the power is cut.
    cut_signal: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Disk> {
        // The daemon must never panic (the kernel would wait on it forever): no unwrap here.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

type Block = Box<[u8; BLOCK]>;

#[derive(Default)]
struct Disk {
    /// Flushed blocks; a block not here reads as zeros.
    durable: HashMap<u64, Block>,
    /// Writes since the last flush, over `durable`; `None` is a block written with zeros.
    cache: HashMap<u64, Option<Block>>,
    cut: bool,
    flushes_to_cut: Option<u64>,
    writes_to_cut: Option<u64>,
    flushes: u64,
    writes: u64,
}

impl Disk {
    fn cut(&mut self, signal: &Condvar) {
        self.cut = true;
        self.flushes_to_cut = None;
        self.writes_to_cut = None;
        signal.notify_all();
    }

    fn power_on(&mut self) {
        self.cache.clear();
        self.cut = false;
        self.flushes_to_cut = None;
        self.writes_to_cut = None;
    }

    /// A block as a reader sees it: the cache over the durable blocks; `None` for zeros.
    fn current(&self, block: u64) -> Option<&[u8; BLOCK]> {
        match self.cache.get(&block) {
            Some(cached) => cached.as_deref(),
            None => self.durable.get(&block).map(|b| &**b),
        }
    }

    fn read(&self, offset: u64, size: u32) -> Vec<u8> {
        let end = offset.saturating_add(u64::from(size)).min(DISK_SIZE);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        for (block, within, len) in blocks(offset, end) {
            match self.current(block) {
                Some(data) => out.extend_from_slice(&data[within..within + len]),
                None => out.resize(out.len() + len, 0),
            }
        }
        out
    }

    /// Takes a write of `data` (zeros where `None`) at `offset` into the cache, unless the power
    /// is cut; then counts it and cuts the power if a cut is armed for it.
    fn write(&mut self, offset: u64, len: u64, data: Option<&[u8]>, signal: &Condvar) {
        self.writes += 1;
        if self.cut {
            return;
        }
        let mut taken = 0;
        for (block, within, n) in blocks(offset, offset + len) {
            let source = data.map(|d| &d[taken..taken + n]);
            let content = if n == BLOCK {
                source.map(|s| {
                    let mut b: Block = Box::new([0; BLOCK]);
                    b.copy_from_slice(s);
                    b
                })
            } else {
                let mut b: Block = Box::new(self.current(block).copied().unwrap_or([0; BLOCK]));
                match source {
                    Some(s) => b[within..within + n].copy_from_slice(s),
                    None => b[within..within + n].fill(0),
                }
                Some(b)
            };
            self.cache.insert(block, content);
            taken += n;
        }
        if let Some(left) = self.writes_to_cut.as_mut() {
            *left -= 1;
            if *left == 0 {
                self.cut(signal);
            }
        }
    }

    /// Makes the cache durable, unless the power is cut or a cut is armed for this flush.
    fn flush(&mut self, signal: &Condvar) {
        self.flushes += 1;
        if self.cut {
            return;
        }
        if let Some(left) = self.flushes_to_cut.as_mut() {
            *left -= 1;
            if *left == 0 {
                self.cut(signal);
                return;
            }
        }
        for (block, content) in self.cache.drain() {
            match content {
                Some(data) if data.iter().any(|&b| b != 0) => {
                    self.durable.insert(block, data);
                }
                _ => {
                    self.durable.remove(&block);
                }
            }
        }
    }
}

/// The blocks that `[start, end)` touches: (block number, offset in it, bytes in it).
fn blocks(start: u64, end: u64) -> impl Iterator<Item = (u64, usize, usize)> {
    let size = BLOCK as u64;
    let mut pos = start;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let within = pos % size;
        let len = (size - within).min(end - pos);
        let item = (pos / size, within as usize, len as usize);
        pos += len;
        Some(item)
    })
}

/// The FUSE file system: a root directory with `disk.img` in it.
struct DiskFs {
    disk: Arc<Shared>,
}

fn attr_of(ino: INodeNo) -> Option<FileAttr> {
    let (kind, size, perm, nlink) = match ino {
        INodeNo::ROOT => (FileType::Directory, 0, 0o755, 2),
        IMAGE_INO => (FileType::RegularFile, DISK_SIZE, 0o600, 1),
        _ => return None,
    };
    Some(FileAttr {
        ino,
        size,
        blocks: size / 512,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: BLOCK as u32,
    })
}

const TTL: Duration = Duration::from_secs(3600);

impl Filesystem for DiskFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match attr_of(IMAGE_INO) {
            Some(attr) if parent == INodeNo::ROOT && name == IMAGE_NAME => {
                reply.entry(&TTL, &attr, fuser::Generation(0));
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match attr_of(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // A disk does not change size; other attributes are fixed and not worth an error.
        match attr_of(ino) {
            Some(_) if size.is_some_and(|s| s != DISK_SIZE) => reply.error(Errno::EPERM),
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == IMAGE_INO {
            // No page cache of disk.img in the kernel: every read and write comes here.
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != IMAGE_INO {
            return reply.error(Errno::EISDIR);
        }
        let data = self.disk.lock().read(offset, size);
        reply.data(&data);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != IMAGE_INO {
            return reply.error(Errno::EISDIR);
        }
        let len = data.len() as u64;
        if offset.saturating_add(len) > DISK_SIZE {
            return reply.error(Errno::ENOSPC);
        }
        self.disk
            .lock()
            .write(offset, len, Some(data), &self.disk.cut_signal);
        reply.written(data.len() as u32);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != IMAGE_INO {
            return reply.error(Errno::EISDIR);
        }
        let end = offset.saturating_add(length).min(DISK_SIZE);
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 && offset < end {
            self.disk
                .lock()
                .write(offset, end - offset, None, &self.disk.cut_signal);
        }
        // Plain allocation: every block of a disk is there already.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.disk.lock().flush(&self.disk.cut_signal);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close, not a cache flush.
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (IMAGE_INO, FileType::RegularFile, IMAGE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// The external programs, found once.
struct Tools {
    losetup: PathBuf,
    mkfs_ext4: PathBuf,
    mount: PathBuf,
    umount: PathBuf,
}

impl Tools {
    fn find() -> Result<Tools, String> {
        Ok(Tools {
            losetup: find_tool("losetup", "util-linux")?,
            mkfs_ext4: find_tool("mkfs.ext4", "e2fsprogs")?,
            mount: find_tool("mount", "mount")?,
            umount: find_tool("umount", "mount")?,
        })
    }
}

/// `name` on the `PATH` or in the sbin directories (which a user's `PATH` may lack).
fn find_tool(name: &str, package: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "the power-loss disk needs `{name}`, which is not installed (package {package})"
            )
        })
}

/// Runs `tool` with `args`; its standard output, or a sentence with its standard error.
fn run(tool: &Path, args: &[&str]) -> Result<String, String> {
    let shown = format!("`{} {}`", tool.display(), args.join(" "));
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| format!("could not run {shown}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(format!(
        "{shown} failed ({}): {}{}",
        out.status,
        stderr.trim(),
        if stdout.trim().is_empty() {
            String::new()
        } else {
            format!("\n{}", stdout.trim())
        }
    ))
}

/// Makes the mount at `dir` shared, so that a mount namespace made with slave propagation (as
/// a test makes one to give a process a boot id of its own) sees it unmounted when this process
/// unmounts it, instead of keeping a copy that holds the disk busy.
fn share(mount: &Path, dir: &Path) -> Result<(), String> {
    run(mount, &["--make-shared", path_str(dir)?])
        .map(drop)
        .map_err(|e| format!("could not make {} a shared mount: {e}", dir.display()))
}

fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

/// The sysfs file that exists while `/dev/loopN` is attached to a file.
fn loop_backing_file(device: &str) -> PathBuf {
    let name = device.trim_start_matches("/dev/");
    Path::new("/sys/block").join(name).join("loop/backing_file")
}
