/*
 * Programs written for MLNX_OFED 4 lean on the standard headers that MOFED's verbs headers pull in:
 * its <infiniband/verbs_exp.h> includes <stdio.h> and <stdlib.h>, its <infiniband/peer_ops.h>
 * includes <errno.h>, <stddef.h> and <stdint.h>, and each includes MOFED's verbs.h (stdint,
 * pthread, stddef, errno, string), which in turn ends by including verbs_exp.h. Upstream
 * libgdsync's test helpers call fprintf/exit with no include of their own.
 *
 * This file includes exactly one header, chosen by GDS_STD_VIA (1: <infiniband/verbs_exp.h>,
 * 2: <infiniband/peer_ops.h>, 3: <gdsync.h>), and nothing else, then uses what that header's MOFED
 * original makes visible. compat-tests/gdsync/run.sh compiles it each way as C and as C++ with
 * -Wall -Wextra -Werror: an implicit declaration or an unknown identifier fails the build.
 */
#if GDS_STD_VIA == 1
#include <infiniband/verbs_exp.h>
#elif GDS_STD_VIA == 2
#include <infiniband/peer_ops.h>
#elif GDS_STD_VIA == 3
#include <gdsync.h>
#else
#error define GDS_STD_VIA to 1, 2 or 3
#endif

struct rec {
	uint32_t a;
	uint64_t b;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char *what, int err)
{
	fprintf(stderr, "%s: %s (%d)\n", what, strerror(err), err);
	exit(EXIT_FAILURE);
}

int main(int argc, char **argv)
{
	size_t n = (size_t)(argc > 1 ? strtoul(argv[1], NULL, 0) : 4);
	struct rec *r = (struct rec *)malloc(n * sizeof(*r));
	char line[64];

	if (!r)
		die("malloc", ENOMEM);
	memset(r, 0, n * sizeof(*r));
	pthread_mutex_lock(&lock);
	r[0].a = (uint32_t)offsetof(struct rec, b);
	pthread_mutex_unlock(&lock);
	snprintf(line, sizeof(line), "%s %u", argv[0], (unsigned)r[0].a);
	errno = 0;
	if (atoi("7") != 7 || getenv("GDS_STD_HEADERS_NEVER_SET") != NULL)
		die("libc", EINVAL);
	printf("%s\n", line);
	puts(errno == ENOSYS ? "?" : "ok");
	free(r);
	return 0;
}
