# Licensed under the Apache License, Version 2.0 (the "License"); you may
# not use this file except in compliance with the License. You may obtain
# a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
# License for the specific language governing permissions and limitations
# under the License.


"""What nova records of the plugin's disk work: the instance-action event
of each host that made (or failed to make) an instance's disks, the
fault's reason, and the outcome of a build whose disks could not be made.

compute-hyperv keeps no module like this one (its driver records no
events of its own); one module per concern is its shape, which this
follows.
"""

from nova.compute import vm_states
from nova import exception as nova_exception
from nova import objects
from oslo_log import log as logging

from prealloc_backend import conf
from prealloc_backend import exception

LOG = logging.getLogger(__name__)
CONF = conf.CONF

# The instance-action event of the plugin's disk work (`openstack server
# event show`): one per host that made (or failed to make) the disks.
DISK_EVENT = 'compute_prealloc_disks'


def short_reason(exc):
    """The reason for nova's fault: nova keeps 255 characters of a fault
    message, and after a rescheduled build's "Exceeded maximum number of
    retries. ... Last exception: Insufficient compute resources: " about 80
    are left: figures first, the disk's path last.
    """
    if isinstance(exc, exception.InsufficientDiskSpace):
        return ('Not enough space to preallocate: %(needed)s bytes needed, '
                '%(free)s bytes free (disk %(path)s)' % exc.kwargs)
    return exc.format_message()


class DiskEvent:
    """DISK_EVENT of the instance's current action, on this host.

    nova's EventReporter, with two differences:

    * nova finishes "the" event of an action by name (the first row of
      that name), so a rescheduled build's second host would overwrite the
      first host's event: each host's event gets its own name,
      DISK_EVENT, then DISK_EVENT + '_2', '_3'... in the order hosts tried;
    * an instance without a current action (an action-less operation)
      records nothing instead of failing the disk work.
    """

    def __init__(self, context, instance):
        self.context = context
        self.uuid = instance.uuid
        self.name = None

    def _free_name(self):
        action = objects.InstanceAction.get_by_request_id(
            self.context, self.uuid, self.context.request_id)
        if action is None:
            return None
        used = {event.event for event in
                objects.InstanceActionEventList.get_by_action(
                    self.context, action.id)}
        name, attempt = DISK_EVENT, 1
        while name in used:
            attempt += 1
            name = '%s_%d' % (DISK_EVENT, attempt)
        return name

    def __enter__(self):
        if self.context is None:
            return self
        try:
            name = self._free_name()
            if name:
                objects.InstanceActionEvent.event_start(
                    self.context, self.uuid, name, want_result=False,
                    host=CONF.host)
                self.name = name
        except nova_exception.InstanceActionNotFound:
            pass
        if not self.name:
            LOG.debug('No instance action to record %s in', DISK_EVENT)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.name:
            return False
        try:
            objects.InstanceActionEvent.event_finish_with_failure(
                self.context, self.uuid, self.name, exc_val=exc_val,
                exc_tb=exc_tb, want_result=False)
        except Exception:
            # Never hide the disk work's own outcome behind the event's.
            LOG.warning('Could not record the %s event', self.name,
                        exc_info=True)
        return False


def build_failure(instance, exc):
    """The exception nova should see for a spawn whose disks could not be
    made (``exc``, a PreallocError): the error itself where nova's own
    handling of a failed spawn applies (not a first build), else
    BuildAbortException where no other host would do better, else
    ComputeResourcesUnavailable (nova tries another host).
    """
    reason = short_reason(exc)
    if instance.vm_state != vm_states.BUILDING:
        # Not a first build (rebuild, unshelve): nova's own
        # handling of a failed spawn applies.
        return exc
    if isinstance(exc, (nova_exception.Invalid,
                        exception.AllocationCancelled)):
        # The same on every host (an invalid flavor policy or
        # option), or the server is being deleted: no other host
        # would do better.
        return nova_exception.BuildAbortException(
            instance_uuid=instance.uuid, reason=reason)
    # A property of this host (no room, no fallocate, a slow or
    # failing disk): let nova try another host. nova's compute
    # manager turns this into a RescheduledException; the reason
    # stays in this host's DISK_EVENT, and in the final fault when
    # [scheduler] max_attempts runs out ("Last exception: ...").
    return nova_exception.ComputeResourcesUnavailable(reason=reason)
