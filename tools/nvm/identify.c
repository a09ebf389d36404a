/* SPDX-License-Identifier: MIT */
/*
 * nvm-identify: identify an NVMe controller (and optionally a namespace) with libnvm, printing
 * upstream's nvm-identify report.
 *
 *   nvm-identify --ctrl=/dev/libnvmN [--ns=N]      through the helper module
 *   nvm-identify --ctrl=[dddd:]bb:dd.f [--ns=N]    module-free: sysfs resource0 + pagemap (root,
 *                                                  no IOMMU, no driver bound), as upstream's
 *                                                  nvm-identify-userspace (installed as a link)
 * Exit status: 0, 99 without --ctrl, 2 for a bad option value, 1 when the controller fails.
 */
#include "nvmtool.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(const char* name)
{
    fprintf(stderr,
            "Usage: %s --ctrl=PATH [--ns=N]\n"
            "  --ctrl=PATH   /dev/libnvmN (helper module) or a PCI address [dddd:]bb:dd.f (module-free:\n"
            "                sysfs resource0 and /proc/self/pagemap, root, no IOMMU, controller unbound)\n"
            "  --ns=N        also identify namespace N\n"
            "  -h, --help    this text\n",
            name);
}

int main(int argc, char** argv)
{
    static const struct option opts[] = {
        { "ctrl", required_argument, NULL, 'c' },
        { "ns", required_argument, NULL, 'n' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char* ctrl_path = NULL;
    uint64_t ns_id = 0;
    int want_ns = 0, opt, rc;
    struct tool_ctrl t;
    struct nvm_ctrl_info info;
    struct nvm_ns_info ns;
    uint16_t n_cqs = 0, n_sqs = 0;

    while ((opt = getopt_long(argc, argv, "c:n:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            ctrl_path = optarg;
            break;
        case 'n':
            if (tool_parse_u64(optarg, &ns_id) != 0 || ns_id == 0 || ns_id > 0xffffffffULL) {
                fprintf(stderr, "Invalid namespace identifier: %s\n", optarg);
                return 2;
            }
            want_ns = 1;
            break;
        case 'h':
            usage(argv[0]);
            return 0;
        default:
            usage(argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "Unexpected argument: %s\n", argv[optind]);
        usage(argv[0]);
        return 2;
    }
    if (ctrl_path == NULL) {
        fprintf(stderr, "Controller is not set (--ctrl)\n");
        usage(argv[0]);
        return 'c';
    }

    rc = tool_open(&t, ctrl_path);
    if (rc != 0) {
        tool_close(&t);
        return 1;
    }
    fprintf(stderr, "Resetting controller and setting up admin queues...\n");
    rc = tool_admin(&t);
    if (rc == 0) {
        rc = nvm_admin_get_num_queues(t.aq, &n_cqs, &n_sqs);
        if (rc != 0) {
            fprintf(stderr, "Failed to get number of queues: %s\n", nvm_strerror(rc));
        }
    }
    if (rc == 0) {
        rc = tool_ctrl_info(&t, &info);
    }
    if (rc == 0) {
        tool_print_ctrl_info(&info, n_cqs, n_sqs);
    }
    if (rc == 0 && want_ns) {
        rc = tool_ns_info(&t, (uint32_t) ns_id, &ns);
        if (rc == 0) {
            tool_print_ns_info(&ns);
        }
    }
    tool_close(&t);
    fprintf(stderr, "Goodbye!\n");
    return rc == 0 ? 0 : 1;
}
