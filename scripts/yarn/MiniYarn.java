// A real single-node YARN (ResourceManager + one NodeManager in one JVM) on 127.0.0.1, for local
// runs and tests: Hadoop's MiniYARNCluster. Run by scripts/yarn.sh as a single-file program:
//   java -cp JARS MiniYarn.java OPTIONS
// Options: --base-dir DIR --ready-file FILE [--rm-port N] [--scheduler-port N]
//          [--tracker-port N] [--admin-port N] [--web-port N] [--memory-mb N] [--vcores N]
// Port 0 (the default) means a free port. Writes FILE (YARN_RM=..., YARN_SCHEDULER=...,
// YARN_TRACKER=..., YARN_ADMIN=..., YARN_WEBAPP=..., YARN_MEMORY_MB=..., YARN_VCORES=...) once
// the NodeManager has registered, then runs until killed; a SIGTERM stops the NodeManager
// (and with it every container) and the ResourceManager.
import java.io.File;
import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.local.LocalConfigKeys;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.resourcemanager.ResourceManager;
import org.apache.hadoop.yarn.webapp.WebApp;
import com.google.inject.servlet.GuiceFilter;

public class MiniYarn {
  public static void main(String[] args) throws Exception {
    String baseDir = null;
    String readyFile = null;
    int rmPort = 0;
    int schedulerPort = 0;
    int trackerPort = 0;
    int adminPort = 0;
    int webPort = 0;
    int memoryMb = 8192;
    int vcores = 8;
    for (int i = 0; i < args.length; i += 2) {
      if (i + 1 >= args.length) {
        throw new IllegalArgumentException("option " + args[i] + " needs a value");
      }
      String value = args[i + 1];
      switch (args[i]) {
        case "--base-dir": baseDir = value; break;
        case "--ready-file": readyFile = value; break;
        case "--rm-port": rmPort = Integer.parseInt(value); break;
        case "--scheduler-port": schedulerPort = Integer.parseInt(value); break;
        case "--tracker-port": trackerPort = Integer.parseInt(value); break;
        case "--admin-port": adminPort = Integer.parseInt(value); break;
        case "--web-port": webPort = Integer.parseInt(value); break;
        case "--memory-mb": memoryMb = Integer.parseInt(value); break;
        case "--vcores": vcores = Integer.parseInt(value); break;
        default: throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    if (baseDir == null || readyFile == null) {
      throw new IllegalArgumentException("--base-dir and --ready-file are required");
    }
    File base = new File(baseDir).getAbsoluteFile();
    // MiniYARNCluster keeps its NodeManager's local and log dirs under
    // ${test.build.data}/NAME and deletes that directory when it starts.
    System.setProperty("test.build.data", base.getPath());

    Configuration conf = new YarnConfiguration();
    // The NodeManager's local file system (FileContext) sets permissions through Java NIO: see
    // NioLocalFs. The class is looked up by name, so through this program's class loader.
    conf.setClassLoader(MiniYarn.class.getClassLoader());
    conf.set("fs.AbstractFileSystem.file.impl", NioLocalFs.class.getName());
    // Our addresses, not the minicluster's "localhost:0" ones; port 0 still means a free port.
    conf.setBoolean(YarnConfiguration.YARN_MINICLUSTER_FIXED_PORTS, true);
    conf.set(YarnConfiguration.RM_HOSTNAME, "127.0.0.1");
    conf.set(YarnConfiguration.RM_BIND_HOST, "127.0.0.1");
    conf.set(YarnConfiguration.RM_ADDRESS, "127.0.0.1:" + rmPort);
    conf.set(YarnConfiguration.RM_SCHEDULER_ADDRESS, "127.0.0.1:" + schedulerPort);
    conf.set(YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS, "127.0.0.1:" + trackerPort);
    conf.set(YarnConfiguration.RM_ADMIN_ADDRESS, "127.0.0.1:" + adminPort);
    conf.set(YarnConfiguration.RM_WEBAPP_ADDRESS, "127.0.0.1:" + webPort);
    conf.set(YarnConfiguration.NM_BIND_HOST, "127.0.0.1");
    // Room for a client-mode application master and a few 1 GiB executors.
    conf.setInt("yarn.minicluster.yarn.nodemanager.resource.memory-mb", memoryMb);
    conf.setInt(YarnConfiguration.NM_PMEM_MB, memoryMb);
    conf.setInt(YarnConfiguration.NM_VCORES, vcores);
    conf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, 256);
    conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, memoryMb);
    conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, vcores);
    conf.setFloat("yarn.scheduler.capacity.maximum-am-resource-percent", 0.5f);
    // Containers share the machine with everything else: no memory policing, no full-disk veto.
    conf.setBoolean(YarnConfiguration.NM_PMEM_CHECK_ENABLED, false);
    conf.setBoolean(YarnConfiguration.NM_VMEM_CHECK_ENABLED, false);
    conf.setFloat(YarnConfiguration.NM_MAX_PER_DISK_UTILIZATION_PERCENTAGE, 99.5f);
    conf.setBoolean(YarnConfiguration.LOG_AGGREGATION_ENABLED, false);
    conf.setBoolean(YarnConfiguration.TIMELINE_SERVICE_ENABLED, false);
    // Keep a finished container's directory only briefly (the app's own logs stay in log-dirs).
    conf.setInt(YarnConfiguration.DEBUG_NM_DELETE_DELAY_SEC, 0);

    // At shutdown the NodeManager kills the running containers, then waits this long (plus
    // 1.25 s) for every application to wind down: 5 s by default.
    conf.setLong(YarnConfiguration.NM_PROCESS_KILL_WAIT_MS, 2000);

    final MiniYARNCluster cluster = new MiniYARNCluster("sparktf-yarn", 1, 1, 1);
    cluster.init(conf);
    cluster.start();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> stop(cluster)));
    if (!cluster.waitForNodeManagersToConnect(60_000)) {
      throw new IllegalStateException("the NodeManager did not register within 60 s");
    }

    ResourceManager rm = cluster.getResourceManager();
    routeWebToResourceManager(rm);
    Configuration live = rm.getConfig();
    StringBuilder ready = new StringBuilder();
    ready.append("YARN_RM=").append(loopback(live, YarnConfiguration.RM_ADDRESS)).append('\n');
    ready.append("YARN_SCHEDULER=")
        .append(loopback(live, YarnConfiguration.RM_SCHEDULER_ADDRESS)).append('\n');
    ready.append("YARN_TRACKER=")
        .append(loopback(live, YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS)).append('\n');
    ready.append("YARN_ADMIN=")
        .append(loopback(live, YarnConfiguration.RM_ADMIN_ADDRESS)).append('\n');
    ready.append("YARN_WEBAPP=")
        .append(loopback(live, YarnConfiguration.RM_WEBAPP_ADDRESS)).append('\n');
    ready.append("YARN_MEMORY_MB=").append(memoryMb).append('\n');
    ready.append("YARN_VCORES=").append(vcores).append('\n');
    File tmp = new File(readyFile + ".tmp");
    Files.write(tmp.toPath(), ready.toString().getBytes(StandardCharsets.UTF_8));
    Files.move(tmp.toPath(), new File(readyFile).toPath(), StandardCopyOption.ATOMIC_MOVE);
    System.out.println("MiniYarn active:\n" + ready);
    Thread.currentThread().join();
  }

  /**
   * Stops the cluster: containers first (the NodeManager's own shutdown), then the rest. The
   * NodeManager then waits 10 s for its scheduled log deletions, which matter to no one once
   * the JVM ends: give the whole stop 15 s.
   */
  private static void stop(MiniYARNCluster cluster) {
    Thread stopping = new Thread(cluster::stop, "stop-yarn");
    stopping.setDaemon(true);
    stopping.start();
    try {
      stopping.join(15_000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** The bound address of KEY (a service started on port 0 writes its real port back). */
  private static String loopback(Configuration conf, String key) {
    String value = conf.get(key);
    return "127.0.0.1:" + value.substring(value.lastIndexOf(':') + 1);
  }

  /**
   * The ResourceManager's and the NodeManager's web apps share one JVM, and Guice's GuiceFilter
   * keeps the servlet pipeline in a static field: the one started last (the NodeManager's) would
   * answer every request, so the ResourceManager's REST API (/ws/v1/cluster/...) and UI would
   * answer 404. Point that field back at the ResourceManager's pipeline; the NodeManager's own
   * pages are not needed here (Spark links to container logs only).
   */
  private static void routeWebToResourceManager(ResourceManager rm) throws Exception {
    Method getWebapp = ResourceManager.class.getDeclaredMethod("getWebapp");
    getWebapp.setAccessible(true);
    Object webapp = getWebapp.invoke(rm);
    Field filterField = WebApp.class.getDeclaredField("guiceFilter");
    filterField.setAccessible(true);
    Object filter = filterField.get(webapp);
    Field injected = GuiceFilter.class.getDeclaredField("injectedPipeline");
    injected.setAccessible(true);
    Field shared = GuiceFilter.class.getDeclaredField("pipeline");
    shared.setAccessible(true);
    shared.set(null, injected.get(filter));
  }

  /**
   * Hadoop's local file system as the NodeManager's FileContext uses it, but setting a
   * permission with one system call, as Hadoop's native library does on a real cluster. The
   * Maven jars carry no native library, and without it Hadoop forks {@code chmod} once per
   * file: a NodeManager localizing a shipped Python environment (44,000 files) spent 160 s
   * there. Same permissions, same checks; only the fork is gone.
   */
  public static final class NioLocalFs extends ChecksumFs {
    public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(new NioRawLocalFs(uri, conf));
    }
  }

  /** Hadoop's RawLocalFs (whose constructors are package-private) over NioRawLocalFileSystem. */
  public static final class NioRawLocalFs extends DelegateToFileSystem {
    public NioRawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new NioRawLocalFileSystem(), conf, "file", false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true;
    }
  }

  /** RawLocalFileSystem whose setPermission is a chmod system call, not a forked chmod. */
  public static final class NioRawLocalFileSystem extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      String bits = String.format("%03o", permission.toShort() & 0777);
      if ((permission.toShort() & ~0777) != 0) {  // setuid, setgid, sticky: Hadoop's own way
        super.setPermission(p, permission);
        return;
      }
      StringBuilder text = new StringBuilder();
      for (char digit : bits.toCharArray()) {
        int d = digit - '0';
        text.append((d & 4) != 0 ? 'r' : '-').append((d & 2) != 0 ? 'w' : '-')
            .append((d & 1) != 0 ? 'x' : '-');
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(text.toString()));
    }
  }
}
