// A real HDFS (NameNode + N DataNodes in one JVM) on 127.0.0.1, for local runs and tests.
// Run by scripts/hdfs.sh as a single-file program: java -cp JARS MiniHdfs.java OPTIONS
// Options: --nn-port N --http-port N --base-dir DIR --ready-file FILE [--datanodes N (1)]
// Every DataNode binds 127.0.0.1 on ports of its own; files keep one replica each, so the
// blocks of a dataset spread over the DataNodes (concurrent reads hit different ones).
// Writes FILE ("HDFS_URI=...\nWEBHDFS_URL=...") once the cluster is active, then runs until killed.
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
  public static void main(String[] args) throws Exception {
    int nnPort = 8020;
    int httpPort = 9870;
    String baseDir = null;
    String readyFile = null;
    int dataNodes = 1;
    for (int i = 0; i < args.length; i += 2) {
      if (i + 1 >= args.length) {
        throw new IllegalArgumentException("option " + args[i] + " needs a value");
      }
      switch (args[i]) {
        case "--nn-port": nnPort = Integer.parseInt(args[i + 1]); break;
        case "--http-port": httpPort = Integer.parseInt(args[i + 1]); break;
        case "--base-dir": baseDir = args[i + 1]; break;
        case "--ready-file": readyFile = args[i + 1]; break;
        case "--datanodes": dataNodes = Integer.parseInt(args[i + 1]); break;
        default: throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    if (baseDir == null || readyFile == null) {
      throw new IllegalArgumentException("--base-dir and --ready-file are required");
    }
    if (dataNodes < 1) {
      throw new IllegalArgumentException("--datanodes must be >= 1, got " + dataNodes);
    }
    File base = new File(baseDir).getAbsoluteFile();
    // MiniDFSCluster keeps the NameNode image in BASE/name-0-1: present means formatted before.
    boolean format = !new File(base, "name-0-1/current/VERSION").exists();

    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getPath());
    conf.setBoolean("dfs.permissions.enabled", true);  // "/" is made 0777 below
    conf.setInt("dfs.replication", 1);
    conf.setBoolean("dfs.webhdfs.enabled", true);
    conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
    conf.set("dfs.namenode.http-bind-host", "127.0.0.1");
    // DataNodes: MiniDFSCluster binds each to 127.0.0.1 on free ports of its own
    // (dfs.datanode.{address,http.address,ipc.address} = 127.0.0.1:0).
    conf.set("hadoop.proxyuser.root.hosts", "*");
    conf.set("hadoop.proxyuser.root.groups", "*");

    final MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
        .nameNodePort(nnPort)
        .nameNodeHttpPort(httpPort)
        .numDataNodes(dataNodes)
        .format(format)
        .manageNameDfsDirs(true)
        .build();
    cluster.waitActive();
    cluster.getFileSystem().setPermission(new org.apache.hadoop.fs.Path("/"),
        new org.apache.hadoop.fs.permission.FsPermission((short) 0777));

    Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));

    String uri = "hdfs://127.0.0.1:" + cluster.getNameNodePort();
    String web = "http://127.0.0.1:" + cluster.getNameNode().getHttpAddress().getPort();
    File tmp = new File(readyFile + ".tmp");
    Files.write(tmp.toPath(), ("HDFS_URI=" + uri + "\nWEBHDFS_URL=" + web + "\n")
        .getBytes(StandardCharsets.UTF_8));
    Files.move(tmp.toPath(), new File(readyFile).toPath(), StandardCopyOption.ATOMIC_MOVE);
    System.out.println("MiniHdfs active: " + uri + " " + web + " (format=" + format
        + ", datanodes=" + cluster.getDataNodes().size() + ")");
    Thread.currentThread().join();
  }
}
