// SPDX-License-Identifier: MIT
/*
 * vm_vfio - libnvm (the library) on QEMU's NVMe controller through vfio-pci under a virtual IOMMU
 * (QEMU's intel-iommu), the module-free path for machines with an IOMMU:
 *
 *   the controller's IOMMU group in a type1 container, BAR0 through the vfio region mmap, bus
 *   mastering through the config region, host memory and gpusim GPU memory (its BAR pages, an
 *   mmap of /dev/gpusim) mapped with VFIO_IOMMU_MAP_DMA at IOVAs far from any physical address,
 *   and those IOVAs given to libnvm as caller-supplied bus addresses (nvm_dma_map). Then: bring-up,
 *   identify, an I/O queue pair, reads with every PRP shape up to MDTS into host and GPU memory
 *   checked against the image pattern (tests/vm/nvme/image.py), and one read to an IOVA that is
 *   not mapped (the vIOMMU must block it; the suite checks its DMAR fault line).
 *
 * Usage: vm_vfio BDF   (bound to vfio-pci by tests/vm/suites/24-vfio-libnvm.sh). Prints
 * "ok - ..." / "not ok - ..." lines, "# blocked-iova 0x..." for the suite, exits 0 only when all
 * checks hold.
 */
#define _GNU_SOURCE
#include <nvm_types.h>
#include <nvm_ctrl.h>
#include <nvm_dma.h>
#include <nvm_aq.h>
#include <nvm_admin.h>
#include <nvm_rpc.h>
#include <nvm_cmd.h>
#include <nvm_queue.h>
#include <nvm_util.h>
#include <nvm_error.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include "gpusim_uapi.h"

#define PATTERN_TAG (0xA5ULL << 56)
#define FILL 0x5a5a5a5a5a5a5a5aULL
/* IOVAs: inside the 39-bit address width of QEMU's intel-iommu, far above guest RAM and the
 * PCI holes, so a DMA that is not translated cannot land anywhere. */
#define IOVA_HOST 0x1000000000ULL
#define IOVA_GPU 0x2000000000ULL
#define IOVA_NONE 0x3000000000ULL

#include "../lib/check.h"
#define OK(cond, ...) check_report(!!(cond), __VA_ARGS__)
/* cond is evaluated once: several are calls */
#define MUST(cond, ...) do { int c_ = !!(cond); OK(c_, __VA_ARGS__); if (!c_) { return 1; } } while (0)

static size_t ps;

static int check(const volatile void* data, size_t len, uint64_t off)
{
    const volatile uint64_t* w = (const volatile uint64_t*) data;
    size_t i;
    for (i = 0; i < len / 8; ++i) {
        if (w[i] != (PATTERN_TAG | (off + 8 * i))) {
            printf("# word at disk byte %llu is %016llx\n", (unsigned long long) (off + 8 * i),
                   (unsigned long long) w[i]);
            return 0;
        }
    }
    return 1;
}

static int all_fill(const volatile void* data, size_t len)
{
    const volatile uint64_t* w = (const volatile uint64_t*) data;
    size_t i;
    for (i = 0; i < len / 8; ++i) {
        if (w[i] != FILL) {
            return 0;
        }
    }
    return 1;
}

static int container = -1;

static int dma_map(void* va, uint64_t iova, size_t size)
{
    struct vfio_iommu_type1_dma_map m = { .argsz = sizeof(m),
                                          .flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
                                          .vaddr = (uintptr_t) va,
                                          .iova = iova,
                                          .size = size };
    return ioctl(container, VFIO_IOMMU_MAP_DMA, &m) == 0 ? 0 : errno;
}

static int dma_unmap(uint64_t iova, size_t size)
{
    struct vfio_iommu_type1_dma_unmap u = { .argsz = sizeof(u), .iova = iova, .size = size };
    return ioctl(container, VFIO_IOMMU_UNMAP_DMA, &u) == 0 && u.size == size ? 0 : errno ? errno : EIO;
}

/* A libnvm window over va: IOVA iova + i * ps for controller page i. */
static nvm_dma_t* window(const nvm_ctrl_t* ctrl, void* va, uint64_t iova, size_t pages)
{
    uint64_t* a = calloc(pages, 8);
    nvm_dma_t* w = NULL;
    size_t i;
    for (i = 0; a && i < pages; ++i) {
        a[i] = iova + i * ps;
    }
    if (a == NULL || nvm_dma_map(&w, ctrl, va, ps, pages, a) != 0) {
        w = NULL;
    }
    free(a);
    return w;
}

static nvm_queue_t cq, sq;
static nvm_dma_t* lists; /* one PRP list page per SQ slot */

static int read_into(uint64_t lba, uint16_t nblks, const uint64_t* io, size_t n)
{
    nvm_cmd_t* cmd = nvm_sq_enqueue(&sq);
    nvm_cpl_t* cpl;
    int st;
    if (cmd == NULL) {
        return EAGAIN;
    }
    size_t slot = (size_t) (cmd - (nvm_cmd_t*) sq.vaddr);
    nvm_cmd_header(cmd, NVM_DEFAULT_CID(&sq), NVM_IO_READ, 1);
    nvm_cmd_data(cmd, ps, n, NVM_DMA_OFFSET(lists, slot), lists->ioaddrs[slot], (uint64_t*) io);
    nvm_cmd_rw_blks(cmd, lba, nblks);
    nvm_sq_submit(&sq);
    cpl = nvm_cq_dequeue_block(&cq, 10000);
    if (cpl == NULL) {
        return ETIME;
    }
    st = NVM_ERR_STATUS(cpl);
    nvm_sq_update(&sq);
    nvm_cq_update(&cq);
    return st;
}

int main(int argc, char** argv)
{
    char path[PATH_MAX], link[PATH_MAX];
    ssize_t n;
    int group, device, rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: %s BDF\n", argv[0]);
        return 2;
    }
    ps = (size_t) sysconf(_SC_PAGESIZE);

    /* --- container, group, device ----------------------------------------------------------- */
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/iommu_group", argv[1]);
    n = readlink(path, link, sizeof(link) - 1);
    MUST(n > 0, "%s has an IOMMU group (intel-iommu present, intel_iommu=on)", argv[1]);
    link[n] = 0;
    const char* gname = strrchr(link, '/') + 1;
    container = open("/dev/vfio/vfio", O_RDWR);
    MUST(container >= 0, "open /dev/vfio/vfio: %s", strerror(errno));
    MUST(ioctl(container, VFIO_GET_API_VERSION) == VFIO_API_VERSION &&
             ioctl(container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) == 1,
         "vfio API %d, type1v2 IOMMU supported", VFIO_API_VERSION);
    snprintf(path, sizeof(path), "/dev/vfio/%s", gname);
    group = open(path, O_RDWR);
    MUST(group >= 0, "open %s: %s", path, strerror(errno));
    struct vfio_group_status gs = { .argsz = sizeof(gs) };
    MUST(ioctl(group, VFIO_GROUP_GET_STATUS, &gs) == 0 && (gs.flags & VFIO_GROUP_FLAGS_VIABLE),
         "group %s viable (flags 0x%x)", gname, gs.flags);
    MUST(ioctl(group, VFIO_GROUP_SET_CONTAINER, &container) == 0 &&
             ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) == 0,
         "group %s in a type1v2 container: %s", gname, strerror(errno));
    device = ioctl(group, VFIO_GROUP_GET_DEVICE_FD, argv[1]);
    MUST(device >= 0, "device fd of %s: %s", argv[1], strerror(errno));
    struct vfio_device_info di = { .argsz = sizeof(di) };
    MUST(ioctl(device, VFIO_DEVICE_GET_INFO, &di) == 0 && (di.flags & VFIO_DEVICE_FLAGS_PCI) &&
             di.num_regions > VFIO_PCI_CONFIG_REGION_INDEX,
         "vfio-pci device: %u regions, %u irqs", di.num_regions, di.num_irqs);

    /* --- BAR0 through the region mmap; bus mastering through config space ------------------- */
    struct vfio_region_info bar0 = { .argsz = sizeof(bar0), .index = VFIO_PCI_BAR0_REGION_INDEX };
    struct vfio_region_info cfg = { .argsz = sizeof(cfg), .index = VFIO_PCI_CONFIG_REGION_INDEX };
    MUST(ioctl(device, VFIO_DEVICE_GET_REGION_INFO, &bar0) == 0 && bar0.size == 0x4000 &&
             (bar0.flags & VFIO_REGION_INFO_FLAG_MMAP),
         "BAR0 region: %llu KiB, mmappable (flags 0x%x)", (unsigned long long) bar0.size >> 10, bar0.flags);
    MUST(ioctl(device, VFIO_DEVICE_GET_REGION_INFO, &cfg) == 0, "config region");
    uint16_t cmdreg = 0;
    MUST(pread(device, &cmdreg, 2, (off_t) cfg.offset + 4) == 2, "read PCI command register");
    cmdreg |= 0x6;
    MUST(pwrite(device, &cmdreg, 2, (off_t) cfg.offset + 4) == 2, "enable memory space and bus mastering");
    /* registers and doorbells: the first 8 KiB (the MSI-X table behind them may be withheld) */
    volatile uint8_t* bar = mmap(NULL, 0x2000, PROT_READ | PROT_WRITE, MAP_SHARED, device, (off_t) bar0.offset);
    MUST(bar != MAP_FAILED, "mmap BAR0 region: %s", strerror(errno));
    MUST(*(volatile uint32_t*) (bar + 8) == 0x10400, "VS 1.4.0 through the vfio mapping");

    nvm_ctrl_t* ctrl = NULL;
    rc = nvm_raw_ctrl_init(&ctrl, bar, 0x2000);
    MUST(rc == 0 && ctrl->max_entries == 2048 && ctrl->timeout == 7500, "nvm_raw_ctrl_init on the vfio BAR0: %s",
         nvm_strerror(rc));

    /* --- host memory at IOVAs ----------------------------------------------------------------- */
    /* pages 0-2 admin (ACQ, ASQ, identify), 3 CQ, 4 SQ, 5-68 PRP lists, 128-255 data */
    enum { HPAGES = 256, DATA0 = 128 };
    void* host = NULL;
    MUST(posix_memalign(&host, ps, HPAGES * ps) == 0, "host memory");
    memset(host, 0, HPAGES * ps);
    rc = dma_map(host, IOVA_HOST, HPAGES * ps);
    MUST(rc == 0, "VFIO_IOMMU_MAP_DMA %d KiB of host memory at IOVA 0x%llx: %s", HPAGES * 4,
         (unsigned long long) IOVA_HOST, strerror(rc));
    nvm_dma_t* hw = window(ctrl, host, IOVA_HOST, HPAGES);
    nvm_dma_t* adm = window(ctrl, host, IOVA_HOST, 3);
    lists = window(ctrl, (char*) host + 5 * ps, IOVA_HOST + 5 * ps, 64);
    MUST(hw && adm && lists && hw->ioaddrs[DATA0] == IOVA_HOST + DATA0 * ps, "nvm_dma_map windows at the IOVAs");

    nvm_aq_ref aq = NULL;
    rc = nvm_aq_create(&aq, ctrl, adm);
    MUST(rc == 0 && (*(volatile uint32_t*) (bar + 0x1c) & 1), "nvm_aq_create (reset, enable), queues at IOVAs: %s",
         nvm_strerror(rc));
    struct nvm_ctrl_info info;
    rc = nvm_admin_ctrl_info(aq, &info, NVM_DMA_OFFSET(adm, 2), adm->ioaddrs[2]);
    OK(rc == 0 && memcmp(info.model_no, "QEMU NVMe Ctrl", 14) == 0 && memcmp(info.serial_no, "gpudirect-rs", 12) == 0 &&
           info.max_data_size == 512 * 1024,
       "identify controller through the IOMMU: %.14s / %.12s, mdts %zu", info.model_no, info.serial_no,
       info.max_data_size);
    struct nvm_ns_info ns;
    rc = nvm_admin_ns_info(aq, &ns, 1, NVM_DMA_OFFSET(adm, 2), adm->ioaddrs[2]);
    MUST(rc == 0 && ns.lba_data_size == 512 && ns.size >= 100000, "identify namespace: %llu blocks",
         (unsigned long long) ns.size);
    uint16_t nc = 1, nsq = 1;
    rc = nvm_admin_request_num_queues(aq, &nc, &nsq);
    OK(rc == 0, "request queues: %u/%u", nc, nsq);
    rc = nvm_admin_cq_create(aq, &cq, 1, NVM_DMA_OFFSET(hw, 3), hw->ioaddrs[3]);
    MUST(rc == 0, "create CQ 1 at IOVA 0x%llx: %s", (unsigned long long) hw->ioaddrs[3], nvm_strerror(rc));
    rc = nvm_admin_sq_create(aq, &sq, &cq, 1, NVM_DMA_OFFSET(hw, 4), hw->ioaddrs[4]);
    MUST(rc == 0, "create SQ 1 at IOVA 0x%llx: %s", (unsigned long long) hw->ioaddrs[4], nvm_strerror(rc));

    char* d = (char*) host + DATA0 * ps;
    const size_t mdts = info.max_data_size / ps;
    rc = read_into(11, 8, hw->ioaddrs + DATA0, 1);
    OK(rc == 0 && check(d, ps, 11 * 512), "host memory: read 4 KiB (PRP1): %s", nvm_strerror(rc));
    rc = read_into(1234, 16, hw->ioaddrs + DATA0, 2);
    OK(rc == 0 && check(d, 2 * ps, 1234 * 512), "host memory: read 8 KiB (PRP1+PRP2): %s", nvm_strerror(rc));
    memset(d, 0, mdts * ps);
    rc = read_into(50000, (uint16_t) (mdts * ps / 512), hw->ioaddrs + DATA0, mdts);
    OK(rc == 0 && check(d, mdts * ps, 50000ULL * 512), "host memory: read MDTS (%zu KiB, PRP list): %s",
       mdts * ps >> 10, nvm_strerror(rc));
    {
        int i, bad = 0;
        for (i = 0; i < 200 && !bad; ++i) {
            /* below every region the storage suites write (27-libnvm-pq: from LBA 40960) */
            uint64_t lba = ((uint64_t) i * 7919 * 8) % 39992;
            rc = read_into(lba, 8, hw->ioaddrs + DATA0 + i % 16, 1);
            bad = rc != 0 || !check(d + (i % 16) * ps, ps, lba * 512);
        }
        OK(!bad, "host memory: %d verified 4 KiB reads (the queues wrap 3 times)", i);
    }

    /* --- GPU memory (gpusim BAR pages) in the container --------------------------------------- */
    int gsfd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
    MUST(gsfd >= 0, "open %s", GPUSIM_DEVICE_PATH);
    const size_t gsz = 1 << 20;
    struct gpusim_alloc ga = { .size = gsz };
    MUST(ioctl(gsfd, GPUSIM_IOC_ALLOC, &ga) == 0, "gpusim alloc 1 MiB");
    volatile uint8_t* g = mmap(NULL, gsz, PROT_READ | PROT_WRITE, MAP_SHARED, gsfd, (off_t) ga.gpu_va);
    MUST(g != MAP_FAILED, "mmap gpusim memory: %s", strerror(errno));
    for (size_t k = 0; k < gsz; k += 8) {
        *(volatile uint64_t*) (g + k) = FILL;
    }
    rc = dma_map((void*) g, IOVA_GPU, gsz);
    OK(rc == 0, "VFIO_IOMMU_MAP_DMA of 1 MiB of gpusim BAR pages at IOVA 0x%llx: %s", (unsigned long long) IOVA_GPU,
       strerror(rc));
    if (rc == 0) {
        nvm_dma_t* gw = window(ctrl, (void*) g, IOVA_GPU, gsz / ps);
        OK(gw != NULL, "nvm_dma_map of the GPU IOVAs");
        /* 64 KiB across a GPU page boundary, PRP list in host memory */
        rc = gw ? read_into(9000, 128, gw->ioaddrs + 8, 16) : EINVAL;
        OK(rc == 0 && check(g + 8 * ps, 16 * ps, 9000ULL * 512) && all_fill(g, 8 * ps) && all_fill(g + 24 * ps, 8 * ps),
           "GPU memory: read 64 KiB through the IOMMU into gpusim memory, nothing outside it touched: %s",
           nvm_strerror(rc));
        /* MDTS into GPU memory with its PRP list in GPU memory too */
        if (gw) {
            nvm_cmd_t* cmd = nvm_sq_enqueue(&sq);
            nvm_cmd_header(cmd, NVM_DEFAULT_CID(&sq), NVM_IO_READ, 1);
            nvm_cmd_data(cmd, ps, mdts, (void*) (g + 255 * ps), gw->ioaddrs[255], gw->ioaddrs + 64);
            nvm_cmd_rw_blks(cmd, 70000, (uint16_t) (mdts * ps / 512));
            nvm_sq_submit(&sq);
            nvm_cpl_t* cpl = nvm_cq_dequeue_block(&cq, 10000);
            rc = cpl ? NVM_ERR_STATUS(cpl) : ETIME;
            if (cpl) {
                nvm_sq_update(&sq);
                nvm_cq_update(&cq);
            }
            OK(rc == 0 && check(g + 64 * ps, mdts * ps, 70000ULL * 512),
               "GPU memory: read MDTS into gpusim memory, PRP list in gpusim memory: %s", nvm_strerror(rc));
            nvm_dma_unmap(gw);
        }
        rc = dma_unmap(IOVA_GPU, gsz);
        OK(rc == 0, "VFIO_IOMMU_UNMAP_DMA of the GPU memory: %s", strerror(rc));
    }

    /* --- an IOVA nobody mapped: the vIOMMU blocks the DMA --------------------------------------- */
    {
        uint64_t none = IOVA_NONE;
        memset(d, 0, ps);
        rc = read_into(12, 8, &none, 1);
        printf("# blocked-iova 0x%llx: read completed with %d (%s); QEMU does not report DMA faults in the status\n",
               (unsigned long long) none, rc, nvm_strerror(rc));
        rc = read_into(13, 8, hw->ioaddrs + DATA0, 1);
        OK(rc == 0 && check(d, ps, 13 * 512), "after the blocked DMA the controller still reads into mapped memory: %s",
           nvm_strerror(rc));
    }

    rc = nvm_admin_sq_delete(aq, &sq, &cq);
    OK(rc == 0, "delete SQ 1: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &cq);
    OK(rc == 0, "delete CQ 1: %s", nvm_strerror(rc));
    nvm_aq_destroy(aq);
    /* stop the controller before its memory leaves the IOMMU */
    *(volatile uint32_t*) (bar + 0x14) &= ~1u;
    for (int i = 0; i < 1000 && (*(volatile uint32_t*) (bar + 0x1c) & 1); ++i) {
        usleep(1000);
    }
    OK(!(*(volatile uint32_t*) (bar + 0x1c) & 1), "controller disabled (CSTS.RDY 0)");
    nvm_dma_unmap(lists);
    nvm_dma_unmap(adm);
    nvm_dma_unmap(hw);
    rc = dma_unmap(IOVA_HOST, HPAGES * ps);
    OK(rc == 0, "VFIO_IOMMU_UNMAP_DMA of the host memory: %s", strerror(rc));
    nvm_ctrl_free(ctrl);
    munmap((void*) bar, 0x2000);
    munmap((void*) g, gsz);
    struct gpusim_free gf = { .gpu_va = ga.gpu_va };
    OK(ioctl(gsfd, GPUSIM_IOC_FREE, &gf) == 0, "gpusim free");
    close(gsfd);
    close(device);
    close(group);
    close(container);
    free(host);
    printf("# %d failure(s)\n", check_failures);
    return check_failures ? 1 : 0;
}
