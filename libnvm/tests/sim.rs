//! libnvm against the software controller (sim/nvmesim): bring-up, identify, queues, I/O with
//! every PRP shape, wrap, the error table, out-of-order completion, timeouts and bad input.
//! Bus addresses are virtual addresses here (nvmesim's DMA is a memcpy).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::{CStr, c_void};
use std::ptr::{NonNull, null_mut};
use std::time::{Duration, Instant};

use nvm::abi::{NvmCmd, NvmCpl, NvmCtrl, NvmCtrlInfo, NvmDma, NvmNsInfo, NvmQueue, admin_op, io_op};
use nvm::capi::*;
use nvm::mmio::Ring;
use nvm::{AdminQueue, Controller, IoQueuePair};
use nvmesim::{Config, Injection, Match, SimController, pattern_byte};

const PS: usize = 4096;
const EINVAL: i32 = libc::EINVAL;
const ETIME: i32 = libc::ETIME;

/// Page-aligned, zeroed host memory.
struct Mem {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Mem {
    fn new(pages: usize) -> Mem {
        let layout = Layout::from_size_align(pages * PS, PS).unwrap();
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        Mem { ptr, layout }
    }
    fn addr(&self, off: usize) -> u64 {
        self.ptr.as_ptr() as u64 + off as u64
    }
    fn ptr(&self, off: usize) -> *mut c_void {
        self.addr(off) as *mut c_void
    }
    #[allow(clippy::mut_from_ref)] // DMA memory: the controller writes it behind &self anyway
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: the allocation is layout.size() bytes and lives as long as self; tests touch
        // it only while no command is outstanding on it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
    fn ring(&self, off: usize, entries: usize, es: usize) -> Ring {
        // SAFETY: inside this allocation (checked by callers' sizes), alive as long as the test.
        unsafe { Ring::new(NonNull::new(self.ptr(off)).unwrap(), entries, es) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

fn fast() -> Config {
    Config { timeout_units: 2, ..Config::default() }
}

/// A controller brought up through the C API: handle, admin window, reference.
struct Up {
    sim: SimController,
    ctrl: *mut NvmCtrl,
    mem: Mem,
    win: *mut NvmDma,
    aq: *mut c_void,
}

impl Up {
    fn new(cfg: Config) -> Up {
        let sim = SimController::start(cfg);
        let mut ctrl = null_mut();
        // SAFETY: the simulator's BAR region is bar_len() bytes and outlives the handle.
        assert_eq!(unsafe { nvm_raw_ctrl_init(&mut ctrl, sim.bar(), sim.bar_len()) }, 0);
        let mem = Mem::new(3);
        let addrs = [mem.addr(0), mem.addr(PS), mem.addr(2 * PS)];
        let mut win = null_mut();
        // SAFETY: valid out-pointer and 3 addresses.
        assert_eq!(unsafe { nvm_dma_map(&mut win, ctrl, mem.ptr(0), PS, 3, addrs.as_ptr()) }, 0);
        let mut aq = null_mut();
        // SAFETY: the window's memory is `mem`, alive as long as the reference.
        assert_eq!(unsafe { nvm_aq_create(&mut aq, ctrl, win) }, 0);
        Up { sim, ctrl, mem, win, aq }
    }
    fn ctrl(&self) -> NvmCtrl {
        // SAFETY: a live handle from nvm_raw_ctrl_init.
        unsafe { *self.ctrl }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        nvm_aq_destroy(self.aq);
        nvm_dma_unmap(self.win);
        nvm_ctrl_free(self.ctrl);
    }
}

fn pad(s: &str, n: usize) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.resize(n, b' ');
    v
}

#[test]
fn bring_up_and_identify() {
    let up = Up::new(fast());
    let c = up.ctrl();
    assert_eq!((c.page_size, c.dstrd, c.timeout, c.max_entries, c.mm_size), (4096, 0, 1000, 2048, 0x4000));
    // AQA in the spec's order: ACQS (27:16) = 256 - 1, ASQS (11:0) = 64 - 1 (upstream swaps).
    assert_eq!(up.sim.reg32(0x24), 0x00ff_003f);
    assert_eq!(up.sim.reg32(0x14), 0x0046_0001);
    assert_eq!(nvm_ctrl_from_aq_ref(up.aq), up.ctrl as *const NvmCtrl);

    let mut info = NvmCtrlInfo::default();
    // SAFETY: info writable; page 2 of the admin window is 4 KiB of host memory.
    let rc = unsafe { nvm_admin_ctrl_info(up.aq, &mut info, up.mem.ptr(2 * PS), up.mem.addr(2 * PS)) };
    assert_eq!(rc, 0);
    assert_eq!(info.nvme_version, 0x10400);
    assert_eq!((info.page_size, info.db_stride, info.timeout, info.contiguous), (4096, 1, 1000, 1));
    assert_eq!(info.max_entries, 2048);
    assert_eq!(info.pci_vendor, [0x36, 0x1b, 0xf4, 0x1a]);
    assert_eq!(info.serial_no.to_vec(), pad("nvmesim0001", 20));
    assert_eq!(info.model_no.to_vec(), pad("nvmesim NVMe Ctrl", 40));
    assert_eq!(info.firmware.to_vec(), pad("0.1", 8));
    assert_eq!((info.max_data_size, info.max_data_pages), (32 * 4096, 32));
    assert_eq!((info.sq_entry_size, info.cq_entry_size, info.max_out_cmds, info.max_n_ns), (64, 16, 0, 1));

    let mut ns = NvmNsInfo::default();
    // SAFETY: as above.
    let rc = unsafe { nvm_admin_ns_info(up.aq, &mut ns, 1, up.mem.ptr(2 * PS), up.mem.addr(2 * PS)) };
    assert_eq!(rc, 0);
    assert_eq!(
        ns,
        NvmNsInfo { ns_id: 1, size: 16384, capacity: 16384, utilization: 16384, lba_data_size: 512, metadata_size: 0 }
    );
    // SAFETY: as above.
    let rc = unsafe { nvm_admin_ns_info(up.aq, &mut ns, 7, up.mem.ptr(2 * PS), up.mem.addr(2 * PS)) };
    assert_eq!(rc, -0x0b);
    // SAFETY: as above.
    let rc = unsafe { nvm_admin_get_log_page(up.aq, 0xffff_ffff, up.mem.ptr(2 * PS), up.mem.addr(2 * PS), 2, 0) };
    assert_eq!(rc, 0);
    assert_eq!(&up.mem.bytes()[2 * PS + 1..2 * PS + 4], &[44, 1, 100]);
    // SAFETY: as above.
    let rc = unsafe { nvm_admin_get_log_page(up.aq, 0, up.mem.ptr(2 * PS), up.mem.addr(2 * PS), 0x7e, 0) };
    assert_eq!(rc, -0x109);
}

#[test]
fn number_of_queues_is_decoded_in_the_specs_order() {
    let up = Up::new(fast());
    let (mut cqs, mut sqs) = (3u16, 5u16);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_admin_request_num_queues(up.aq, &mut cqs, &mut sqs) }, 0);
    assert_eq!((cqs, sqs), (3, 5));
    let (mut c2, mut s2) = (0u16, 0u16);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_admin_get_num_queues(up.aq, &mut c2, &mut s2) }, 0);
    assert_eq!((c2, s2), (3, 5));
    assert_eq!(nvm_admin_set_num_queues(up.aq, 2, 9), 0);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_admin_get_num_queues(up.aq, &mut c2, &mut s2) }, 0);
    assert_eq!((c2, s2), (2, 9));
    assert_eq!(nvm_admin_set_num_queues(up.aq, 0, 1), EINVAL);
}

#[test]
fn many_admin_commands_do_not_stall() {
    // Upstream's 64th admin command times out (the ACQ head doorbell is never written).
    let up = Up::new(fast());
    for i in 0..700 {
        let (mut c, mut s) = (0u16, 0u16);
        // SAFETY: valid pointers.
        let rc = unsafe { nvm_admin_get_num_queues(up.aq, &mut c, &mut s) };
        assert_eq!(rc, 0, "admin command {i}");
        assert_eq!((c, s), (64, 64));
    }
    assert!(up.sim.stats().admin_commands.load(std::sync::atomic::Ordering::Relaxed) >= 700);
}

#[test]
fn raw_rpc_restores_the_callers_cid() {
    let up = Up::new(fast());
    let mut cmd = NvmCmd::default();
    cmd.header(77, admin_op::GET_FEATURES, 0);
    cmd.dword[10] = 7;
    let mut cpl = NvmCpl::default();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_raw_rpc(up.aq, &mut cmd, &mut cpl) }, 0);
    assert_eq!(cpl.cid(), 77);
    assert_eq!(cmd.cid(), 77);
    assert_eq!(cpl.dword[0], 0x003f_003f);
    cmd.header(5, 0x7f, 0);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_raw_rpc(up.aq, &mut cmd, &mut cpl) }, -1);
    assert_eq!(cpl.cid(), 5);
    assert!(cpl.status() & 0x8000 != 0, "DNR delivered");
}

/// Builds a read/write the way nvm_cmd_data does, with an optional list page.
fn rw(op: u8, lba: u64, nblk: u16, data: &[u64], list: Option<(&Mem, usize)>) -> NvmCmd {
    let mut c = NvmCmd::default();
    c.header(0, op, 1);
    let prp2 = if data.len() > 2 {
        let (m, off) = list.expect("list page");
        let cap = PS / 8;
        for (i, a) in data[1..].iter().take(cap).enumerate() {
            m.bytes()[off + 8 * i..off + 8 * i + 8].copy_from_slice(&a.to_le_bytes());
        }
        m.addr(off)
    } else if data.len() == 2 {
        data[1]
    } else {
        0
    };
    c.data_ptr(data[0], prp2);
    c.rw_blks(lba, nblk);
    c
}

struct Io {
    up: Up,
    qmem: Mem,
    qp: Option<IoQueuePair>,
    aq: AdminQueue,
}

/// An I/O queue pair (id 1) in host memory, through the safe API on its own admin queue.
fn io_setup(cfg: Config) -> Io {
    let up = Up::new(cfg);
    nvm_aq_destroy(up.aq);
    let mut up = up;
    up.aq = null_mut();
    // SAFETY: the simulator's BAR is bar_len() bytes and outlives the controller.
    let regs = unsafe { nvm::mmio::Regs::new(NonNull::new(up.sim.bar()).unwrap(), up.sim.bar_len()) };
    let ctrl = std::sync::Arc::new(Controller::from_regs(regs).unwrap());
    let aq =
        AdminQueue::create(ctrl, up.mem.ring(0, 256, 16), up.mem.ring(PS, 64, 64), up.mem.addr(0), up.mem.addr(PS))
            .unwrap();
    let qmem = Mem::new(2);
    let qp =
        IoQueuePair::create(&aq, 1, qmem.ring(0, 256, 16), qmem.addr(0), qmem.ring(PS, 64, 64), qmem.addr(PS)).unwrap();
    assert_eq!((qp.sq.max_entries, qp.cq.max_entries), (64, 256));
    Io { up, qmem, qp: Some(qp), aq }
}

impl Io {
    fn run(&mut self, cmd: &NvmCmd) -> NvmCpl {
        let qp = self.qp.as_mut().unwrap();
        let cid = qp.enqueue(cmd).unwrap();
        qp.submit();
        let cpl = qp.wait(5000).expect("completion");
        assert_eq!(cpl.cid(), cid);
        cpl
    }
}

fn check_pattern(buf: &[u8], disk_off: u64) {
    for (i, b) in buf.iter().enumerate() {
        assert_eq!(*b, pattern_byte(disk_off + i as u64), "byte {i} of a read at {disk_off}");
    }
}

#[test]
fn reads_with_every_prp_shape() {
    let mut io = io_setup(fast());
    let data = Mem::new(40);
    let list = Mem::new(1);
    let pages: Vec<u64> = (0..40).map(|i| data.addr(i * PS)).collect();
    // PRP1 only, at an offset inside the page (one block).
    data.bytes().fill(0xee);
    let mut c = rw(io_op::READ, 3, 1, &[data.addr(512)], None);
    assert_eq!(nvm::Status::of(&io.run(&c)).packed(), 0);
    check_pattern(&data.bytes()[512..1024], 3 * 512);
    assert_eq!(data.bytes()[511], 0xee);
    assert_eq!(data.bytes()[1024], 0xee);
    // PRP1 + PRP2: 8 KiB.
    data.bytes().fill(0xee);
    c = rw(io_op::READ, 100, 16, &pages[..2], None);
    assert_eq!(nvm::Status::of(&io.run(&c)).packed(), 0);
    check_pattern(&data.bytes()[..2 * PS], 100 * 512);
    // PRP list: 5 pages, then MDTS (32 pages = 128 KiB).
    for n in [5usize, 17, 32] {
        data.bytes().fill(0xee);
        c = rw(io_op::READ, 1000, (n * 8) as u16, &pages[..n], Some((&list, 0)));
        assert_eq!(nvm::Status::of(&io.run(&c)).packed(), 0, "{n} pages");
        check_pattern(&data.bytes()[..n * PS], 1000 * 512);
        assert_eq!(data.bytes()[n * PS], 0xee);
    }
    // One page beyond MDTS: Invalid Field, with DNR.
    c = rw(io_op::READ, 0, 33 * 8, &pages[..33], Some((&list, 0)));
    let cpl = io.run(&c);
    assert_eq!(nvm::Status::of(&cpl).packed(), -2);
    assert!(nvm::Status::of(&cpl).dnr);
    // Past the end: LBA out of range.
    c = rw(io_op::READ, 16383, 2, &pages[..1], None);
    assert_eq!(nvm::Status::of(&io.run(&c)).packed(), -0x80);
    // Wrong namespace.
    c = rw(io_op::READ, 0, 1, &pages[..1], None);
    c.dword[1] = 2;
    assert_eq!(nvm::Status::of(&io.run(&c)).packed(), -0x0b);
    drop(data);
    let qp = io.qp.take().unwrap();
    qp.delete(&io.aq).unwrap();
    let _ = &io.qmem;
}

#[test]
fn writes_land_and_read_back() {
    let mut io = io_setup(fast());
    let data = Mem::new(8);
    let list = Mem::new(1);
    let pages: Vec<u64> = (0..8).map(|i| data.addr(i * PS)).collect();
    for (i, b) in data.bytes().iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let c = rw(io_op::WRITE, 200, 64, &pages, Some((&list, 0)));
    assert_eq!(nvm::Status::of(&io.run(&c)).packed(), 0);
    let mut f = NvmCmd::default();
    f.header(0, io_op::FLUSH, 1);
    assert_eq!(nvm::Status::of(&io.run(&f)).packed(), 0);
    {
        let st = io.up.sim.storage();
        assert_eq!(&st[200 * 512..200 * 512 + 8 * PS], &data.bytes()[..]);
        assert_eq!(st[200 * 512 - 1], pattern_byte(200 * 512 - 1));
        assert_eq!(st[200 * 512 + 8 * PS], pattern_byte(200 * 512 + 8 * PS as u64));
    }
    let back = Mem::new(8);
    let bp: Vec<u64> = (0..8).map(|i| back.addr(i * PS)).collect();
    let c = rw(io_op::READ, 200, 64, &bp, Some((&list, 0)));
    assert_eq!(nvm::Status::of(&io.run(&c)).packed(), 0);
    assert_eq!(back.bytes(), data.bytes());
}

#[test]
fn queues_wrap_many_times_at_depth() {
    let mut io = io_setup(fast());
    let data = Mem::new(16);
    let qp = io.qp.as_mut().unwrap();
    let total = 3000u32;
    let (mut sent, mut done) = (0u32, 0u32);
    let mut lba_of = std::collections::HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < total {
        while sent < total && sent - done < 16 {
            let slot = (sent % 16) as usize;
            let lba = u64::from(sent * 13 % 16000);
            let c = rw(io_op::READ, lba, 1, &[data.addr(slot * PS)], None);
            let Ok(cid) = qp.enqueue(&c) else { break };
            lba_of.insert(cid, (lba, slot));
            sent += 1;
        }
        qp.submit();
        if let Some(cpl) = qp.poll() {
            assert_eq!(nvm::Status::of(&cpl).packed(), 0);
            let (lba, slot) = lba_of.remove(&cpl.cid()).expect("known CID");
            check_pattern(&data.bytes()[slot * PS..slot * PS + 512], lba * 512);
            done += 1;
        }
        assert!(Instant::now() < deadline, "stuck at {done}/{total}");
    }
    // 3000 commands through a 64-entry SQ and a 256-entry CQ: > 40 and > 10 wraps.
    assert!(lba_of.is_empty());
}

#[test]
fn out_of_order_completions_reach_their_commands() {
    let mut io = io_setup(fast());
    io.up.sim.set_out_of_order(true);
    let data = Mem::new(32);
    let qp = io.qp.as_mut().unwrap();
    let mut want = std::collections::HashMap::new();
    for i in 0..32usize {
        let lba = (i * 37) as u64;
        let cid = qp.enqueue(&rw(io_op::READ, lba, 8, &[data.addr(i * PS)], None)).unwrap();
        want.insert(cid, (lba, i));
    }
    qp.submit();
    let mut order = Vec::new();
    while !want.is_empty() {
        let cpl = qp.wait(5000).expect("completion");
        assert_eq!(nvm::Status::of(&cpl).packed(), 0);
        let (lba, i) = want.remove(&cpl.cid()).expect("each CID once");
        check_pattern(&data.bytes()[i * PS..(i + 1) * PS], lba * 512);
        order.push(i);
    }
    assert_ne!(order, (0..32).collect::<Vec<_>>(), "the controller did complete out of order");
}

/// (sct, sc) pairs of the spec's status table (§B8), each delivered exactly to the command.
const TABLE: [(u8, u8); 30] = [
    (0, 0x01),
    (0, 0x02),
    (0, 0x03),
    (0, 0x04),
    (0, 0x06),
    (0, 0x07),
    (0, 0x08),
    (0, 0x0b),
    (0, 0x0c),
    (0, 0x13),
    (0, 0x15),
    (0, 0x80),
    (0, 0x81),
    (0, 0x82),
    (0, 0x83),
    (1, 0x00),
    (1, 0x01),
    (1, 0x02),
    (1, 0x03),
    (1, 0x05),
    (1, 0x09),
    (1, 0x0c),
    (1, 0x0d),
    (1, 0x80),
    (1, 0x82),
    (2, 0x80),
    (2, 0x81),
    (2, 0x82),
    (2, 0x85),
    (2, 0x87),
];

#[test]
fn the_error_table_is_delivered_exactly() {
    let mut io = io_setup(fast());
    let data = Mem::new(1);
    for (k, (sct, sc)) in TABLE.iter().copied().enumerate() {
        let dnr = k % 2 == 0;
        io.up.sim.inject(Injection {
            matches: Match { admin: false, opcode: Some(io_op::READ) },
            sct,
            sc,
            dnr,
            count: 1,
        });
        let cpl = io.run(&rw(io_op::READ, 0, 1, &[data.addr(0)], None));
        let s = nvm::Status::of(&cpl);
        assert_eq!((s.sct, s.sc, s.dnr), (sct, sc, dnr));
        let packed = s.packed();
        assert_eq!(packed, -((i32::from(sct) << 8) | i32::from(sc)));
        // SAFETY: nvm_strerror returns a static C string.
        let text = unsafe { CStr::from_ptr(nvm_strerror(packed)) }.to_str().unwrap();
        assert_eq!(text, nvm::status::nvme_text(sct, sc).unwrap());
        // The next command is unaffected.
        let ok = io.run(&rw(io_op::READ, 0, 1, &[data.addr(0)], None));
        assert!(nvm::Status::of(&ok).is_ok());
    }
    // Admin: the packed status comes back from the exported function.
    io.up.sim.inject(Injection {
        matches: Match { admin: true, opcode: Some(admin_op::GET_FEATURES) },
        sct: 1,
        sc: 0x0e,
        dnr: true,
        count: 1,
    });
    assert_eq!(io.aq.get_num_queues().unwrap_err().packed(), -0x10e);
    assert_eq!(io.aq.get_num_queues().unwrap(), (64, 64));
}

#[test]
fn queue_create_delete_errors() {
    let up = Up::new(fast());
    let q = Mem::new(4);
    let mut cq = NvmQueue::default();
    let mut sq = NvmQueue::default();
    // SAFETY: valid descriptors; queue memory is `q`.
    unsafe {
        assert_eq!(nvm_admin_cq_create(up.aq, &mut cq, 0, q.ptr(0), q.addr(0)), EINVAL);
        assert_eq!(nvm_admin_cq_create(up.aq, &mut cq, 1, q.ptr(0), q.addr(0)), 0);
        assert_eq!(cq.max_entries, 256);
        assert_eq!(cq.db as usize, up.sim.bar() as usize + 0x100c);
        assert_eq!(nvm_admin_cq_create(up.aq, &mut NvmQueue::default(), 1, q.ptr(PS), q.addr(PS)), -0x101);
        let ghost = NvmQueue { no: 9, ..cq };
        assert_eq!(nvm_admin_sq_create(up.aq, &mut sq, &ghost, 1, q.ptr(PS), q.addr(PS)), -0x100);
        assert_eq!(nvm_admin_sq_create(up.aq, &mut sq, &cq, 1, q.ptr(PS), q.addr(PS)), 0);
        assert_eq!(sq.max_entries, 64);
        assert_eq!(nvm_admin_sq_create(up.aq, &mut sq, std::ptr::null(), 2, q.ptr(PS), q.addr(PS)), EINVAL);
        // Number of Queues after queues exist: Command Sequence Error.
        assert_eq!(nvm_admin_set_num_queues(up.aq, 1, 1), -0x0c);
        assert_eq!(nvm_admin_cq_delete(up.aq, &mut cq), -0x10c);
        assert_eq!(nvm_admin_sq_delete(up.aq, &mut sq, &cq), 0);
        assert!(sq.db.is_null());
        assert_eq!(nvm_admin_sq_delete(up.aq, &mut sq, &cq), EINVAL);
        assert_eq!(nvm_admin_cq_delete(up.aq, &mut cq), 0);
        assert_eq!(nvm_admin_cq_delete(up.aq, &mut cq), EINVAL);
    }
}

#[test]
fn a_stalled_controller_times_out_and_recovers() {
    let up = Up::new(fast());
    up.sim.set_stalled(true);
    let t = Instant::now();
    let (mut c, mut s) = (0u16, 0u16);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_admin_get_num_queues(up.aq, &mut c, &mut s) }, ETIME);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(1000) && took < Duration::from_secs(5), "{took:?}");
    up.sim.set_stalled(false);
    // The late completion of the timed-out command is discarded, not taken for this one's.
    let mut cmd = NvmCmd::default();
    cmd.header(9, admin_op::IDENTIFY, 0);
    cmd.data_ptr(up.mem.addr(2 * PS), 0);
    cmd.dword[10] = 1;
    let mut cpl = NvmCpl::default();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_raw_rpc(up.aq, &mut cmd, &mut cpl) }, 0);
    assert_eq!(&up.mem.bytes()[2 * PS + 4..2 * PS + 15], b"nvmesim0001");
    assert_eq!(cpl.cid(), 9);
}

#[test]
fn reset_honours_cap_to_and_reports_fatal_status() {
    let sim = SimController::start(Config { never_ready: true, timeout_units: 1, ..Config::default() });
    let mut ctrl = null_mut();
    // SAFETY: the BAR outlives the handle.
    assert_eq!(unsafe { nvm_raw_ctrl_init(&mut ctrl, sim.bar(), sim.bar_len()) }, 0);
    let mem = Mem::new(2);
    let t = Instant::now();
    assert_eq!(nvm_raw_ctrl_reset(ctrl, mem.addr(0), mem.addr(PS)), ETIME);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(4), "{took:?}");
    let addrs = [mem.addr(0), mem.addr(PS)];
    let mut win = null_mut();
    let mut aq = null_mut();
    // SAFETY: valid pointers; the window is `mem`.
    unsafe {
        assert_eq!(nvm_dma_map(&mut win, ctrl, mem.ptr(0), PS, 2, addrs.as_ptr()), 0);
        assert_eq!(nvm_aq_create(&mut aq, ctrl, win), ETIME, "a failed reset fails nvm_aq_create");
    }
    assert!(aq.is_null());
    nvm_dma_unmap(win);
    nvm_ctrl_free(ctrl);

    let sim = SimController::start(Config { fatal_on_enable: true, ..Config::default() });
    // SAFETY: as above.
    assert_eq!(unsafe { nvm_raw_ctrl_init(&mut ctrl, sim.bar(), sim.bar_len()) }, 0);
    assert_eq!(nvm_raw_ctrl_reset(ctrl, mem.addr(0), mem.addr(PS)), libc::EIO);
    nvm_ctrl_free(ctrl);
}

#[test]
fn page_size_outside_the_controllers_range_is_erange() {
    let sim = SimController::start(Config { mpsmin: 1, mpsmax: 4, ..Config::default() });
    let mut ctrl = null_mut();
    // SAFETY: the BAR outlives the call.
    assert_eq!(unsafe { nvm_raw_ctrl_init(&mut ctrl, sim.bar(), sim.bar_len()) }, libc::ERANGE);
    assert!(ctrl.is_null());
}

#[test]
fn dma_map_splits_large_pages_and_checks_sizes() {
    let up = Up::new(fast());
    let mut w = null_mut();
    let addrs = [0x10_0000u64, 0x40_0000];
    // SAFETY: valid pointers; the addresses are never dereferenced.
    unsafe {
        assert_eq!(nvm_dma_map(&mut w, up.ctrl, null_mut(), 0x1_0000, 2, addrs.as_ptr()), 0);
        let d = &*w;
        assert_eq!((d.page_size, d.n_ioaddrs, d.vaddr), (4096, 32, null_mut()));
        let io = std::slice::from_raw_parts(w.cast::<u8>().add(24).cast::<u64>(), 32);
        assert_eq!(io[0], 0x10_0000);
        assert_eq!(io[15], 0x10_f000);
        assert_eq!(io[16], 0x40_0000);
        nvm_dma_unmap(w);
        assert_eq!(nvm_dma_map(&mut w, up.ctrl, null_mut(), 512, 1, addrs.as_ptr()), EINVAL);
        assert!(w.is_null());
        assert_eq!(nvm_dma_map(&mut w, up.ctrl, null_mut(), 0, 1, addrs.as_ptr()), EINVAL);
        assert_eq!(nvm_dma_map(&mut w, up.ctrl, null_mut(), 4096, 0, addrs.as_ptr()), EINVAL);
        assert_eq!(nvm_dma_map(&mut w, up.ctrl, null_mut(), 4096, 1, std::ptr::null()), EINVAL);
        // Module-backed windows need a module-backed controller.
        assert_eq!(nvm_dma_map_host(&mut w, up.ctrl, up.mem.ptr(0), 4096), libc::EBADF);
        assert_eq!(nvm_dma_map_device(&mut w, up.ctrl, up.mem.ptr(0), 65536), libc::EBADF);
        assert_eq!(nvm_dma_create(&mut w, up.ctrl, 4096), libc::EBADF);
    }
}

#[test]
fn bad_input_gets_einval_not_a_crash() {
    let up = Up::new(fast());
    let bogus = 0x1234usize as *mut c_void;
    let mut q = NvmQueue::default();
    let mut cpl = NvmCpl::default();
    let mut cmd = NvmCmd::default();
    let (mut a, mut b) = (1u16, 1u16);
    // SAFETY: every pointer is NULL, valid, or a bogus handle the library must reject unread.
    unsafe {
        assert_eq!(nvm_ctrl_init(std::ptr::null_mut(), 0), EINVAL);
        let mut c = null_mut();
        assert_eq!(nvm_ctrl_init(&mut c, -1), libc::EBADF);
        assert_eq!(nvm_raw_ctrl_init(std::ptr::null_mut(), up.sim.bar(), 0x4000), EINVAL);
        assert_eq!(nvm_raw_ctrl_init(&mut c, null_mut(), 0x4000), EINVAL);
        assert_eq!(nvm_raw_ctrl_init(&mut c, up.sim.bar(), 0x1fff), EINVAL);
        assert_eq!(nvm_raw_ctrl_reset(std::ptr::null(), 0, 0), EINVAL);
        assert_eq!(nvm_raw_ctrl_reset(bogus.cast(), 0, 0), EINVAL);
        nvm_ctrl_free(std::ptr::null_mut());
        nvm_ctrl_free(bogus.cast());
        let mut w = null_mut();
        assert_eq!(nvm_dma_map(std::ptr::null_mut(), up.ctrl, null_mut(), 4096, 1, [1u64].as_ptr()), EINVAL);
        assert_eq!(nvm_dma_map(&mut w, bogus.cast(), null_mut(), 4096, 1, [1u64].as_ptr()), EINVAL);
        assert_eq!(nvm_dma_map_host(&mut w, std::ptr::null(), bogus, 4096), EINVAL);
        assert_eq!(nvm_dma_create(std::ptr::null_mut(), up.ctrl, 4096), EINVAL);
        nvm_dma_unmap(std::ptr::null_mut());
        nvm_dma_unmap(bogus.cast());
        let mut r = null_mut();
        assert_eq!(nvm_aq_create(&mut r, up.ctrl, bogus.cast()), EINVAL);
        assert_eq!(nvm_aq_create(&mut r, std::ptr::null(), up.win), EINVAL);
        assert_eq!(nvm_aq_create(std::ptr::null_mut(), up.ctrl, up.win), EINVAL);
        nvm_aq_destroy(std::ptr::null_mut());
        nvm_aq_destroy(bogus);
        nvm_rpc_unbind(bogus);
        assert!(nvm_ctrl_from_aq_ref(std::ptr::null_mut()).is_null());
        assert!(nvm_ctrl_from_aq_ref(bogus).is_null());
        assert_eq!(nvm_raw_rpc(bogus, &mut cmd, &mut cpl), EINVAL);
        assert_eq!(nvm_raw_rpc(up.aq, std::ptr::null_mut(), &mut cpl), EINVAL);
        assert_eq!(nvm_raw_rpc(up.aq, &mut cmd, std::ptr::null_mut()), EINVAL);
        let mut info = NvmCtrlInfo::default();
        assert_eq!(nvm_admin_ctrl_info(up.aq, std::ptr::null_mut(), up.mem.ptr(0), 1), EINVAL);
        assert_eq!(nvm_admin_ctrl_info(up.aq, &mut info, null_mut(), 1), EINVAL);
        assert_eq!(nvm_admin_ctrl_info(up.aq, &mut info, up.mem.ptr(2 * PS), 0), EINVAL);
        assert_eq!(nvm_admin_ctrl_info(bogus, &mut info, up.mem.ptr(2 * PS), 1), EINVAL);
        let mut ns = NvmNsInfo::default();
        assert_eq!(nvm_admin_ns_info(up.aq, std::ptr::null_mut(), 1, up.mem.ptr(0), 1), EINVAL);
        assert_eq!(nvm_admin_ns_info(up.aq, &mut ns, 1, null_mut(), 1), EINVAL);
        assert_eq!(nvm_admin_ns_info(up.aq, &mut ns, 1, up.mem.ptr(2 * PS), 0), EINVAL);
        assert_eq!(nvm_admin_get_log_page(up.aq, 0, null_mut(), 1, 2, 0), EINVAL);
        assert_eq!(nvm_admin_get_log_page(bogus, 0, up.mem.ptr(2 * PS), 1, 2, 0), EINVAL);
        assert_eq!(nvm_admin_set_num_queues(bogus, 1, 1), EINVAL);
        assert_eq!(nvm_admin_get_num_queues(up.aq, std::ptr::null_mut(), &mut b), EINVAL);
        assert_eq!(nvm_admin_get_num_queues(up.aq, &mut a, std::ptr::null_mut()), EINVAL);
        a = 0;
        assert_eq!(nvm_admin_request_num_queues(up.aq, &mut a, &mut b), EINVAL);
        assert_eq!(nvm_admin_request_num_queues(up.aq, std::ptr::null_mut(), &mut b), EINVAL);
        assert_eq!(nvm_admin_cq_create(up.aq, std::ptr::null_mut(), 1, null_mut(), 0), EINVAL);
        assert_eq!(nvm_admin_cq_create(bogus, &mut q, 1, null_mut(), 0), EINVAL);
        assert_eq!(nvm_admin_sq_create(up.aq, std::ptr::null_mut(), &q, 1, null_mut(), 0), EINVAL);
        assert_eq!(nvm_admin_cq_delete(up.aq, std::ptr::null_mut()), EINVAL);
        assert_eq!(nvm_admin_cq_delete(up.aq, &mut q), EINVAL);
        assert_eq!(nvm_admin_sq_delete(up.aq, &mut q, std::ptr::null()), EINVAL);
        assert_eq!(nvm_admin_sq_delete(up.aq, std::ptr::null_mut(), &q), EINVAL);
        nvm_queue_clear(std::ptr::null_mut(), up.ctrl, true, 1, null_mut(), 0);
        nvm_queue_clear(&mut q, std::ptr::null(), true, 1, null_mut(), 0);
        assert!(nvm_cq_dequeue_block(std::ptr::null_mut(), 1).is_null());
        assert!(nvm_cq_dequeue_block(&mut NvmQueue::default(), 1).is_null());
    }
    // The reference still works after all that.
    // SAFETY: valid pointers.
    assert_eq!(unsafe { nvm_admin_get_num_queues(up.aq, &mut a, &mut b) }, 0);
}

#[test]
fn queue_clear_and_dequeue_block() {
    let up = Up::new(fast());
    let mem = Mem::new(1);
    let mut q = NvmQueue::default();
    // SAFETY: valid pointers; the ring is `mem`.
    unsafe {
        nvm_queue_clear(&mut q, up.ctrl, true, 3, mem.ptr(0), mem.addr(0));
        assert_eq!((q.no, q.max_entries, q.entry_size, q.phase, q.ioaddr), (3, 256, 16, 1, mem.addr(0)));
        assert_eq!(q.db as usize, up.sim.bar() as usize + 0x1000 + 7 * 4);
        // Doorbell of queue 2000 lies beyond the 16 KiB mapping: NULL, not a wild pointer.
        nvm_queue_clear(&mut q, up.ctrl, false, 2000, mem.ptr(0), mem.addr(0));
        assert!(q.db.is_null());
        nvm_queue_clear(&mut q, up.ctrl, true, 3, mem.ptr(0), mem.addr(0));
        let t = Instant::now();
        assert!(nvm_cq_dequeue_block(&mut q, 50).is_null());
        assert!(t.elapsed() >= Duration::from_millis(50));
        // A posted entry (phase 1) is returned and the head advances.
        mem.bytes()[14] = 1;
        let p = nvm_cq_dequeue_block(&mut q, 50);
        assert_eq!(p as usize, mem.addr(0) as usize);
        assert_eq!(q.head, 1);
    }
}

#[test]
fn strerror_texts() {
    let s = |v| {
        // SAFETY: nvm_strerror returns a static C string.
        unsafe { CStr::from_ptr(nvm_strerror(v)) }.to_str().unwrap().to_owned()
    };
    assert_eq!(s(0), "Success");
    assert_eq!(s(22), "Invalid argument");
    assert_eq!(s(-1), "Invalid command opcode");
    assert_eq!(s(-0x80), "LBA out of range");
    assert_eq!(s(-0x101), "Invalid queue identifier");
    assert_eq!(s(-0x10c), "Invalid queue deletion");
    assert_eq!(s(-0x281), "Unrecovered read error");
    assert_eq!(s(-0x700), "Unknown status code type");
    // The same pointer every time (static strings).
    assert_eq!(nvm_strerror(-1), nvm_strerror(-1));
}

#[test]
fn ctrl_init_over_files() {
    use std::os::fd::AsRawFd;
    let mut c = null_mut();
    // /dev/null cannot be mapped: mmap's errno, not a crash (upstream compares with NULL).
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null").unwrap();
    // SAFETY: valid out-pointer.
    let rc = unsafe { nvm_ctrl_init(&mut c, null.as_raw_fd()) };
    assert_eq!(rc, libc::ENODEV);
    assert!(c.is_null());
    // A regular file of zeros maps; CAP = 0 allows only 4 KiB pages. The handle keeps its own
    // descriptor (the caller closes theirs), and the module ioctls fail on a non-module file.
    let path = std::env::temp_dir().join(format!("nvm-fake-bar-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; 0x4000]).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { nvm_ctrl_init(&mut c, f.as_raw_fd()) }, 0);
    drop(f);
    std::fs::remove_file(&path).unwrap();
    // SAFETY: a live handle.
    let h = unsafe { *c };
    assert_eq!((h.mm_size, h.page_size, h.timeout, h.max_entries), (0x2000, 4096, 0, 1));
    let buf = Mem::new(1);
    let mut w = null_mut();
    // SAFETY: valid pointers; the buffer is ours.
    unsafe {
        assert_eq!(nvm_dma_map_host(&mut w, c, buf.ptr(0), 4096), libc::ENOTTY);
        assert_eq!(nvm_dma_map_host(&mut w, c, buf.ptr(0), 0), EINVAL);
        assert_eq!(nvm_dma_create(&mut w, c, 4096), libc::ENOTTY);
    }
    assert!(w.is_null());
    nvm_ctrl_free(c);
}

#[test]
fn bus_addresses_other_than_virtual_ones() {
    // The controller sees IOVAs (virtual + 2^50); nvmesim translates them back.
    const OFF: u64 = 1 << 50;
    let translate = nvmesim::Translate(std::sync::Arc::new(|bus: u64, _len: usize| bus.checked_sub(OFF)));
    let sim = SimController::start(Config { translate: Some(translate), ..fast() });
    let mut ctrl = null_mut();
    let mem = Mem::new(3);
    let iova = [mem.addr(0) + OFF, mem.addr(PS) + OFF, mem.addr(2 * PS) + OFF];
    let (mut win, mut aq) = (null_mut(), null_mut());
    let mut info = NvmCtrlInfo::default();
    // SAFETY: valid pointers; the BAR and `mem` outlive the handles.
    unsafe {
        assert_eq!(nvm_raw_ctrl_init(&mut ctrl, sim.bar(), sim.bar_len()), 0);
        assert_eq!(nvm_dma_map(&mut win, ctrl, mem.ptr(0), PS, 3, iova.as_ptr()), 0);
        assert_eq!(nvm_aq_create(&mut aq, ctrl, win), 0);
        assert_eq!(nvm_admin_ctrl_info(aq, &mut info, mem.ptr(2 * PS), iova[2]), 0);
        assert_eq!(&info.serial_no[..11], b"nvmesim0001");
        // A virtual address is not a bus address on this controller: Data Transfer Error.
        assert_eq!(nvm_admin_ctrl_info(aq, &mut info, mem.ptr(2 * PS), mem.addr(2 * PS)), -0x04);
    }
    nvm_aq_destroy(aq);
    nvm_dma_unmap(win);
    nvm_ctrl_free(ctrl);
}

#[test]
fn chained_prp_lists_and_mdts_zero() {
    // MDTS 0 ("no limit"): libnvm reports what one PRP list page can describe (1 + 512 pages).
    let mut io = io_setup(Config { mdts: 0, ..fast() });
    // SAFETY: page 2 of the admin window: 4 KiB of host memory alive as long as `io`.
    let buf = unsafe { std::slice::from_raw_parts(io.up.mem.ptr(2 * PS) as *const std::cell::Cell<u8>, 4096) };
    let info = io.aq.ctrl_info(buf, io.up.mem.addr(2 * PS)).unwrap();
    assert_eq!((info.max_data_size, info.max_data_pages), (513 * 4096, 513));
    // 600 pages: PRP1 + a list whose first page ends with a pointer to the second (chaining).
    let n = 600usize;
    let data = Mem::new(n);
    let lists = Mem::new(2);
    let mut c = NvmCmd::default();
    c.header(0, io_op::READ, 1);
    let put = |page: usize, idx: usize, v: u64| {
        lists.bytes()[page * PS + 8 * idx..page * PS + 8 * idx + 8].copy_from_slice(&v.to_le_bytes());
    };
    for i in 0..511 {
        put(0, i, data.addr((1 + i) * PS));
    }
    put(0, 511, lists.addr(PS));
    for i in 0..(n - 1 - 511) {
        put(1, i, data.addr((512 + i) * PS));
    }
    c.data_ptr(data.addr(0), lists.addr(0));
    c.rw_blks(100, (n * 8) as u16);
    data.bytes().fill(0xee);
    assert_eq!(nvm::Status::of(&io.run(&c)).packed(), 0);
    check_pattern(data.bytes(), 100 * 512);
}
