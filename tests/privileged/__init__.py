
"""Privileged tier: tests that need root.

Loop-mounted filesystems, the real privsep daemon started through
privsep-helper, and attacker processes run as an unprivileged user created
for the test. Run with ``tox -e privileged`` (as root).
"""

from nova import monkey_patch; monkey_patch.patch()  # noqa
