/* version.h - mgpu's version, the one string that mgpu-launch, mgpu-worker, libmgpu's
 * pkg-config files and the man pages print (the Makefile reads it from here). */
#ifndef MGPU_VERSION_H
#define MGPU_VERSION_H

#ifndef MGPU_VERSION
#define MGPU_VERSION "0.1.0"
#endif

#endif
