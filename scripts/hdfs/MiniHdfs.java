// A real HDFS (NameNode + N DataNodes in one JVM) on 127.0.0.1, for local runs and tests.
// Run by scripts/hdfs.sh as a single-file program: java -cp JARS MiniHdfs.java OPTIONS
// Options: --nn-port N --http-port N --base-dir DIR --ready-file FILE [--datanodes N (1)]
//          [--kerberos-dir DIR --kerberos-user NAME]
// Every DataNode binds 127.0.0.1 on ports of its own; files keep one replica each, so the
// blocks of a dataset spread over the DataNodes (concurrent reads hit different ones).
// Writes FILE ("HDFS_URI=...\nWEBHDFS_URL=...") once the cluster is active, then runs until killed.
//
// With --kerberos-dir the cluster is secured by a MiniKdc (Apache Kerby) started in this JVM on
// 127.0.0.1 and a free port. DIR receives krb5.conf (the JVM must be started with
// -Djava.security.krb5.conf=DIR/krb5.conf), service.keytab (hdfs/ and HTTP/ for localhost and
// 127.0.0.1) and user.keytab (NAME@REALM, a superuser of this cluster through a static group
// mapping into the supergroup). FILE is written only once NAME, logged in from its keytab, has
// created and deleted a file through hdfs:// (RPC) and webhdfs:// (SPNEGO); it then also holds
// KRB5_CONFIG, SPARKTF_HDFS_PRINCIPAL and SPARKTF_HDFS_KEYTAB.
import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.PrivilegedExceptionAction;
import java.util.Properties;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.minikdc.MiniKdc;
import org.apache.hadoop.security.UserGroupInformation;

public class MiniHdfs {
  // The address every server binds and advertises: 127.0.0.1, or --host (a multi-host test's).
  static String HOST = "127.0.0.1";

  public static void main(String[] args) throws Exception {
    int nnPort = 8020;
    int httpPort = 9870;
    String baseDir = null;
    String readyFile = null;
    int dataNodes = 1;
    String krbDir = null;
    String krbUser = null;
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
        case "--kerberos-dir": krbDir = args[i + 1]; break;
        case "--kerberos-user": krbUser = args[i + 1]; break;
        case "--host": HOST = args[i + 1]; break;
        default: throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    if (baseDir == null || readyFile == null) {
      throw new IllegalArgumentException("--base-dir and --ready-file are required");
    }
    if (dataNodes < 1) {
      throw new IllegalArgumentException("--datanodes must be >= 1, got " + dataNodes);
    }
    if ((krbDir == null) != (krbUser == null)) {
      throw new IllegalArgumentException("--kerberos-dir and --kerberos-user go together");
    }
    File base = new File(baseDir).getAbsoluteFile();
    // MiniDFSCluster keeps the NameNode image in BASE/name-0-1: present means formatted before.
    boolean format = !new File(base, "name-0-1/current/VERSION").exists();

    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getPath());
    conf.setBoolean("dfs.permissions.enabled", true);  // "/" is made 0777 below
    conf.setInt("dfs.replication", 1);
    conf.setBoolean("dfs.webhdfs.enabled", true);
    // MiniDFSCluster's own clients (its DataNodes, waitActive) reach the NameNode at
    // localhost: with --host, the NameNode also listens on the host's loopback (a
    // scripts/netcluster.sh host has no other interface than that and its address).
    String nnBind = HOST.equals("127.0.0.1") ? HOST : "0.0.0.0";
    conf.set("dfs.namenode.rpc-bind-host", nnBind);
    conf.set("dfs.namenode.http-bind-host", nnBind);
    // DataNodes: on 127.0.0.1 (MiniDFSCluster's own), on free ports of their own; with --host
    // on HOST, started below.
    boolean onLoopback = HOST.equals("127.0.0.1");

    conf.set("hadoop.proxyuser.root.hosts", "*");
    conf.set("hadoop.proxyuser.root.groups", "*");

    Kerberos krb = null;
    if (krbDir != null) {
      krb = Kerberos.start(new File(krbDir).getAbsoluteFile(), krbUser);
      krb.secure(conf);
    }

    final MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
        .nameNodePort(nnPort)
        .nameNodeHttpPort(httpPort)
        .numDataNodes(onLoopback ? dataNodes : 0)
        .format(format)
        .manageNameDfsDirs(true)
        .build();
    if (!onLoopback) {
      // With --host the DataNodes reach the NameNode at HOST (MiniDFSCluster's own
      // configuration names localhost): the NameNode hands clients the address a DataNode
      // registered from, and its name (WebHDFS redirects).
      Configuration dnConf = new Configuration(conf);
      dnConf.setInt("dfs.replication", 1);
      String nnAddress = HOST + ":" + cluster.getNameNodePort();
      dnConf.set("fs.defaultFS", "hdfs://" + nnAddress);
      dnConf.set("dfs.namenode.rpc-address", nnAddress);
      dnConf.set("dfs.datanode.address", HOST + ":0");
      dnConf.set("dfs.datanode.http.address", HOST + ":0");
      dnConf.set("dfs.datanode.ipc.address", HOST + ":0");
      dnConf.set("dfs.datanode.hostname", HOST);
      cluster.startDataNodes(dnConf, dataNodes, null, true, null, null, null, null, null,
          false, true, true, null, null, null);
      cluster.waitActive();
      conf.setInt("dfs.replication", 1);  // MiniDFSCluster lowered it to the 0 it started
    }
    final Kerberos kerberos = krb;
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      cluster.shutdown();
      if (kerberos != null) {
        kerberos.stop();
      }
    }));
    cluster.waitActive();
    cluster.getFileSystem().setPermission(new Path("/"), new FsPermission((short) 0777));

    String uri = "hdfs://" + HOST + ":" + cluster.getNameNodePort();
    String web = "http://" + HOST + ":" + cluster.getNameNode().getHttpAddress().getPort();
    String ready = "HDFS_URI=" + uri + "\nWEBHDFS_URL=" + web + "\n";
    if (krb != null) {
      krb.awaitUserWrites(conf, uri, "webhdfs://" + HOST + ":"
          + cluster.getNameNode().getHttpAddress().getPort());
      ready += "KRB5_CONFIG=" + krb.krb5conf + "\nSPARKTF_HDFS_PRINCIPAL=" + krb.userPrincipal
          + "\nSPARKTF_HDFS_KEYTAB=" + krb.userKeytab + "\n";
    }
    File tmp = new File(readyFile + ".tmp");
    Files.write(tmp.toPath(), ready.getBytes(StandardCharsets.UTF_8));
    Files.move(tmp.toPath(), new File(readyFile).toPath(), StandardCopyOption.ATOMIC_MOVE);
    System.out.println("MiniHdfs active: " + uri + " " + web + " (format=" + format
        + ", datanodes=" + cluster.getDataNodes().size()
        + (krb != null ? ", kerberos realm " + krb.realm : "") + ")");
    Thread.currentThread().join();
  }

  /** The MiniKdc of a Kerberized cluster, its files, and the Hadoop settings that use them. */
  static final class Kerberos {
    final String realm;
    final File krb5conf;
    final File serviceKeytab;
    final File userKeytab;
    final String userPrincipal;
    final String userName;
    MiniKdc kdc;

    private Kerberos(String realm, File dir, String user) {
      this.realm = realm;
      this.krb5conf = new File(dir, "krb5.conf");
      this.serviceKeytab = new File(dir, "service.keytab");
      this.userKeytab = new File(dir, "user.keytab");
      this.userName = user;
      this.userPrincipal = user + "@" + realm;
    }

    static Kerberos start(File dir, String user) throws Exception {
      int port;
      try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName(HOST))) {
        port = s.getLocalPort();
      }
      Properties kdcConf = MiniKdc.createConf();
      kdcConf.setProperty(MiniKdc.KDC_BIND_ADDRESS, HOST);
      kdcConf.setProperty(MiniKdc.KDC_PORT, Integer.toString(port));
      kdcConf.setProperty(MiniKdc.TRANSPORT, "TCP");
      String realm = (kdcConf.getProperty(MiniKdc.ORG_NAME) + "."
          + kdcConf.getProperty(MiniKdc.ORG_DOMAIN)).toUpperCase(java.util.Locale.ROOT);
      Kerberos k = new Kerberos(realm, dir, user);
      // This JVM and every client read the krb5.conf written here (the JVM is started with
      // -Djava.security.krb5.conf pointing at it). Kerby writes one of its own into its work
      // directory and points the property there; it is pointed back after the start.
      k.writeKrb5Conf(port);
      k.kdc = new MiniKdc(kdcConf, new File(dir, "kdc"));
      k.kdc.start();
      System.setProperty("java.security.krb5.conf", k.krb5conf.getPath());
      if (!realm.equals(k.kdc.getRealm())) {
        throw new IllegalStateException("MiniKdc realm " + k.kdc.getRealm() + " != " + realm);
      }
      k.kdc.createPrincipal(k.serviceKeytab, "hdfs/localhost", "hdfs/" + HOST,
          "HTTP/localhost", "HTTP/" + HOST);
      k.kdc.createPrincipal(k.userKeytab, user);
      for (File f : new File[] {k.serviceKeytab, k.userKeytab}) {
        Files.setPosixFilePermissions(f.toPath(), PosixFilePermissions.fromString("rw-------"));
      }
      return k;
    }

    private void writeKrb5Conf(int port) throws IOException {
      String text = String.join("\n",
          "# Written by scripts/hdfs.sh start --kerberos for the MiniKdc of this cluster.",
          "[libdefaults]",
          "  default_realm = " + realm,
          "  udp_preference_limit = 1",
          "  rdns = false",
          "  dns_canonicalize_hostname = false",
          "  dns_lookup_kdc = false",
          "  dns_lookup_realm = false",
          "  ticket_lifetime = 24h",
          "  renew_lifetime = 7d",
          "  forwardable = true",
          "[realms]",
          "  " + realm + " = {",
          "    kdc = " + HOST + ":" + port,
          "  }",
          "[domain_realm]",
          "  localhost = " + realm,
          "  " + HOST + " = " + realm,
          "");
      File tmp = new File(krb5conf.getPath() + ".tmp");
      Files.write(tmp.toPath(), text.getBytes(StandardCharsets.UTF_8));
      Files.setPosixFilePermissions(tmp.toPath(), PosixFilePermissions.fromString("rw-------"));
      Files.move(tmp.toPath(), krb5conf.toPath(), StandardCopyOption.ATOMIC_MOVE);
    }

    /** Secures the cluster: Kerberos RPC, SPNEGO on WebHDFS, block tokens, authorization. */
    void secure(Configuration conf) {
      // the service principals name the host clients reach: localhost, or --host's name
      String host = HOST.equals("127.0.0.1") ? "localhost" : HOST;
      String hdfs = "hdfs/" + host + "@" + realm;
      conf.set("hadoop.security.authentication", "kerberos");
      conf.setBoolean("hadoop.security.authorization", true);
      conf.set("dfs.namenode.kerberos.principal", hdfs);
      conf.set("dfs.namenode.keytab.file", serviceKeytab.getPath());
      conf.set("dfs.datanode.kerberos.principal", hdfs);
      conf.set("dfs.datanode.keytab.file", serviceKeytab.getPath());
      // "*": the SPNEGO filter accepts every HTTP/ principal in the keytab, so a client may ask
      // for HTTP/localhost (Java, which canonicalizes 127.0.0.1) or HTTP/127.0.0.1 (MIT, rdns off).
      conf.set("dfs.web.authentication.kerberos.principal", "*");
      conf.set("dfs.web.authentication.kerberos.keytab", serviceKeytab.getPath());
      // With security on, HttpServer2 puts the hadoop.http.authentication filter in front of
      // every path, WebHDFS included; its default type is "simple" (user.name= is believed).
      conf.set("hadoop.http.authentication.type", "kerberos");
      conf.set("hadoop.http.authentication.kerberos.principal", "*");
      conf.set("hadoop.http.authentication.kerberos.keytab", serviceKeytab.getPath());
      conf.setBoolean("hadoop.http.authentication.simple.anonymous.allowed", false);
      conf.setBoolean("dfs.block.access.token.enable", true);
      // DataNodes on unprivileged ports without SASL on data transfer, as Hadoop's own secure
      // MiniDFSCluster tests run them; block tokens still guard every block access. (MiniDFSCluster
      // first asks for privileged ports and prints the refusal, "Unable to bind on specified
      // streaming port in secure context", into the log; the DataNodes then start regardless.)
      conf.setBoolean("ignore.secure.ports.for.testing", true);
      // The user principal is a superuser of this test cluster, as the OS user is without
      // Kerberos (it runs the NameNode), so tests may write under any absolute path.
      conf.set("hadoop.user.group.static.mapping.overrides",
          "dr.who=;" + userName + "=supergroup");
      conf.set("dfs.permissions.superusergroup", "supergroup");
      UserGroupInformation.setConfiguration(conf);
    }

    /** Waits until the user principal creates and deletes a file through both routes. */
    void awaitUserWrites(Configuration conf, String hdfsUri, String webhdfsUri) throws Exception {
      UserGroupInformation ugi = UserGroupInformation.loginUserFromKeytabAndReturnUGI(
          userPrincipal, userKeytab.getPath());
      Path probe = new Path("/tmp/.sparktf-probe-" + ProcessHandle.current().pid());
      for (String fsUri : new String[] {hdfsUri, webhdfsUri}) {
        for (int attempt = 1; ; attempt++) {
          try {
            ugi.doAs((PrivilegedExceptionAction<Void>) () -> {
              try (FileSystem fs = FileSystem.newInstance(URI.create(fsUri), conf)) {
                try (OutputStream out = fs.create(probe, true)) {
                  out.write('k');
                }
                fs.delete(probe, false);
              }
              return null;
            });
            break;
          } catch (IOException e) {
            if (attempt % 10 == 1) {
              System.out.println("MiniHdfs: " + userPrincipal + " cannot write through "
                  + fsUri + " yet: " + e);
            }
            Thread.sleep(500);
          }
        }
      }
    }

    void stop() {
      kdc.stop();
    }
  }
}
